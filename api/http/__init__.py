"""The HTTP side: the OpenAI Batch API (`/v1`), the dashboard (`/`) and `/metrics`."""
