"""What a command opens (the store, a job file, an output file), a user's mistake as one
line."""

from __future__ import annotations

import click

from core.jobs import JobTooLarge, iter_job_file
from core.settings import Settings


def open_store(settings: Settings, readonly: bool = False):
    """A sessionmaker for the configured database, migrated to the latest revision.

    A SQLite file named in APPLESPEC_DATABASE_URL must exist (a mistyped path is an error,
    not a new empty database); only `applespec db upgrade` creates one there. The default
    location ($XDG_DATA_HOME/applespec/applespec.db) is created on first use.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from api.client import open_sessions
    from core.settings import default_database_url
    from core.store.database import StoreGone, sqlite_file

    path = sqlite_file(settings.database_url)
    if path is not None and not path.exists() and settings.database_url != default_database_url():
        raise click.ClickException(
            f"no database at {path} (APPLESPEC_DATABASE_URL): check the path, or create "
            "a new database there with `applespec db upgrade`"
        )
    try:
        return open_sessions(settings.database_url, readonly=readonly)
    except (SQLAlchemyError, StoreGone) as e:
        raise click.ClickException(
            settings.redact(f"cannot open the database: {e.__class__.__name__}: {e}")
        ) from e


def read_job_file(path: str, settings: Settings):
    """The file's lines, streamed (core.jobs.iter_job_file); its size is checked now."""
    try:
        return iter_job_file(path, settings.job_limits())
    except JobTooLarge as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:
        raise click.ClickException(f"cannot read {path}: {e.strerror or e}") from e


def open_output(path: str):
    """Open an output file for writing; a path that cannot be written is a one-line error."""
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise click.ClickException(f"cannot write {path}: {e.strerror}") from e
