import pytest

from tests.store.conftest import postgres_url, sqlite_url  # noqa: F401 - both stores


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    """Each test gets its own SQLite store."""
    url = f"sqlite:///{tmp_path / 'applespec.db'}"
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", url)
    return url
