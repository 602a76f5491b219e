"""A farm for HTTP tests: real Redis, a real `applespec worker`, a real `applespec serve`."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from migrations import upgrade
from tests.store.conftest import PG_ADMIN
from tests.worker.service import Store, Worker, cli_ok, service_env, unique_model

from .server import Server

# Small limits, so the limit tests upload little.
MAX_FILE_BYTES = 64 * 1024
MAX_LINES = 200


@contextlib.contextmanager
def fresh_database(backend: str, tmp: Path):
    """A new empty store: a SQLite file, or a uniquely named PostgreSQL database (dropped)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp / 'store.db'}"
        return
    name = f"applespec_http_{uuid.uuid4().hex[:12]}"
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


@dataclass
class Farm:
    backend: str
    db_url: str
    env: dict[str, str]
    model: str
    key: str  # an API key made with `applespec keys create`
    server: Server
    store: Store
    tmp: Path

    @property
    def base_url(self) -> str:
        return self.server.url + "/v1"

    def client(self, key: str | None = None, **kwargs):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=key or self.key, max_retries=0, **kwargs)

    def new_key(self, name: str) -> str:
        return cli_ok(self.env, "keys", "create", name).strip().splitlines()[-1]


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def farm(request, tmp_path_factory):
    """One worker and one server per store backend, shared by the HTTP tests."""
    backend = request.param
    tmp = tmp_path_factory.mktemp(f"http-{backend}")
    with fresh_database(backend, tmp) as db_url:
        model = unique_model()
        env = service_env(
            db_url,
            APPLESPEC_MODEL=model,
            APPLESPEC_MAX_FILE_BYTES=str(MAX_FILE_BYTES),
            APPLESPEC_MAX_LINES=str(MAX_LINES),
            APPLESPEC_HEARTBEAT_INTERVAL="1",  # a cancel reaches running rows within a second
        )
        upgrade(db_url)
        key = cli_ok(env, "keys", "create", "pipeline").strip().splitlines()[-1]
        worker = Worker(env, model, tmp / "worker.log")
        server = Server(env, tmp / "server.log")
        store = Store(db_url)
        try:
            server.wait_ready()
            worker.wait_ready()
            yield Farm(backend, db_url, env, model, key, server, store, tmp)
        finally:
            server.stop()
            worker.stop()
            store.dispose()
