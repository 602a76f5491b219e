import pytest


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    """Each test gets its own SQLite store."""
    url = f"sqlite:///{tmp_path / 'applespec.db'}"
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", url)
    return url


from tests.store.conftest import postgres_url, sqlite_url  # noqa: E402, F401 - both stores
