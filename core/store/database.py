"""Engines and sessions: SQLite by default (WAL, busy_timeout, foreign keys), PostgreSQL by URL.

A SQLite engine remembers which file it opened (device and inode) and refuses to begin a
transaction once that file is gone or replaced (`StoreGone`): an open connection would go on
writing into a deleted file, and a new one would create an empty database in its place.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

SQLITE_BUSY_TIMEOUT_MS = 30_000


class StoreGone(RuntimeError):
    """The SQLite file this process opened was deleted or replaced: stop, write nothing."""


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names (None for another backend or an in-memory database)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    if "mode=memory" in url:
        return None
    return Path(parsed.database).expanduser()


def make_engine(url: str, **kwargs: Any) -> Engine:
    """A SQLAlchemy engine for `url`.

    SQLite gets WAL, a busy timeout (workers and the CLI write concurrently) and foreign keys
    on every connection, and every transaction starts with BEGIN IMMEDIATE: pysqlite would
    begin only at the first write, so a read-then-write (claiming an item while a cancel
    commits) could act on a stale read. Its parent directory is created, and every
    transaction first checks that the file is still the one first opened (`StoreGone`).
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True, **kwargs)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000}, **kwargs)
    event.listen(engine, "connect", _sqlite_pragmas)
    if parsed.database and parsed.database != ":memory:" and "mode=memory" not in url:
        guard = _FileGuard(Path(parsed.database).expanduser())
        event.listen(engine, "do_connect", guard.before_connect)
        event.listen(engine, "connect", guard.on_connect)
        event.listen(engine, "begin", guard.check)
    event.listen(engine, "begin", _sqlite_begin)
    return engine


class _FileGuard:
    """The identity (device, inode) of the SQLite file an engine opened first."""

    def __init__(self, path: Path):
        self.path = path
        self.identity: tuple[int, int] | None = self._stat()

    def _stat(self) -> tuple[int, int] | None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def before_connect(self, *_args: Any) -> None:
        # Once a file was opened, a new connection must not create an empty one in its place.
        if self.identity is not None:
            self.check()

    def on_connect(self, _dbapi_connection: Any, _record: Any) -> None:
        if self.identity is None:  # SQLite has just created the file
            self.identity = self._stat()
        self.check()

    def check(self, *_args: Any) -> None:
        now = self._stat()
        if now is None:
            raise StoreGone(f"the SQLite database {self.path} was deleted or moved")
        if now != self.identity:
            raise StoreGone(f"the SQLite database {self.path} was replaced by another file")


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
