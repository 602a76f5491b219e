import pytest

from migrations import upgrade
from tests.store.conftest import postgres_url, sqlite_url  # noqa: F401 - both stores


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    """Each test gets its own SQLite store, made as `applespec db upgrade` makes it."""
    url = f"sqlite:///{tmp_path / 'applespec.db'}"
    upgrade(url)
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", url)
    return url
