from tests.store.conftest import postgres_url  # noqa: F401 - a fresh PostgreSQL database
