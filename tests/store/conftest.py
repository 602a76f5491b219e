import uuid

import psycopg
import pytest

from core.store.database import make_engine, make_sessionmaker
from migrations import upgrade

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'store.db'}"


@pytest.fixture
def postgres_url():
    """A fresh, uniquely named PostgreSQL database, dropped afterwards (reruns stay clean)."""
    name = f"applespec_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as e:
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN}: {e}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", "postgresql"])
def sessions(request):
    """Sessions on a migrated store, once per backend."""
    url = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "postgres_url")
    upgrade(url)
    engine = make_engine(url)
    yield make_sessionmaker(engine)
    engine.dispose()
