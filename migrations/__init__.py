"""Alembic migrations for the store, shipped inside the package (`applespec db upgrade`)."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def alembic_config(url: str | None = None):
    """An Alembic Config for this package; `url` overrides APPLESPEC_DATABASE_URL."""
    from alembic.config import Config

    config = Config(str(HERE / "alembic.ini"))
    config.set_main_option("script_location", str(HERE))
    if url:
        # ConfigParser treats % as interpolation.
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (idempotent)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


def head_revision() -> str:
    """The newest revision this package ships."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(url: str) -> str | None:
    """The revision the database at `url` is at (None: not migrated, or no database)."""
    from alembic.migration import MigrationContext

    from core.store.database import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
