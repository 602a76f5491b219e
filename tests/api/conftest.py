import pytest

from tests import standin_engine


@pytest.fixture(autouse=True)
def store(tmp_path, monkeypatch):
    """Each test gets its own SQLite store (and the engine, or its stand-in before it lands)."""
    standin_engine.install()
    url = f"sqlite:///{tmp_path / 'applespec.db'}"
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", url)
    return url
