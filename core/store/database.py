"""Engines and sessions: SQLite by default (WAL, busy_timeout, foreign keys), PostgreSQL by URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine for `url`.

    SQLite gets WAL, a busy timeout (workers and the CLI write concurrently) and foreign keys
    on every connection, and every transaction starts with BEGIN IMMEDIATE: pysqlite would
    begin only at the first write, so a read-then-write (claiming an item while a cancel
    commits) could act on a stale read. Its parent directory is created.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


def _sqlite_begin(connection: Any) -> None:
    mode = connection.get_execution_options().get("sqlite_begin", "IMMEDIATE")
    connection.exec_driver_sql(f"BEGIN {mode}")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.isolation_level = None  # we emit BEGIN ourselves (_sqlite_begin)
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # WAL + NORMAL: no fsync per commit (each item commits twice); a commit survives a process
    # crash, and at worst the last items re-run after a power loss (results are idempotent).
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_sessionmaker(engine: Engine, readonly: bool = False) -> sessionmaker[Session]:
    """Sessions on `engine`; `readonly` ones begin DEFERRED on SQLite (they never hold the
    write lock, so polling `status` does not stall the workers' commits)."""
    if readonly:
        engine = engine.execution_options(sqlite_begin="DEFERRED")
    return sessionmaker(engine, expire_on_commit=False)
