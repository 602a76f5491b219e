"""Job lines and polling for the HTTP tests."""

from __future__ import annotations

import json
import time


def request_line(custom_id: str, content: str, max_tokens: int = 8, **body) -> dict:
    """A chat line as a pipeline written for OpenAI sends it (its own model name included)."""
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "gpt-4o-mini",
            "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens,
            **body,
        },
    }


def write_jsonl(path, lines) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def wait_done(client, batch_id: str, timeout: float = 120):
    """Poll batches.retrieve until the batch is finished; the finished batch."""
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled", "expired"):
            return batch
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}"
        time.sleep(0.5)
