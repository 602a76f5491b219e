"""One settings object, read from the environment (`APPLESPEC_*`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


def default_database_url(env: Mapping[str, str] = os.environ) -> str:
    """SQLite under the user's data dir: `$XDG_DATA_HOME/applespec/applespec.db`.

    `~/.local/share/applespec/applespec.db` when XDG_DATA_HOME is unset. One fixed place (not
    the working directory) so `run`, `submit`, `results` and local workers all see the same jobs.
    """
    base = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return f"sqlite:///{base / 'applespec' / 'applespec.db'}"


@dataclass(frozen=True)
class Settings:
    """Everything the service reads from the environment.

    Attributes:
        database_url: APPLESPEC_DATABASE_URL; SQLite by default, `postgresql+psycopg://...`
            for a farm.
        broker_url: APPLESPEC_BROKER_URL, the Celery broker (Redis).
        model: APPLESPEC_MODEL, the default model spec.
        max_attempts: APPLESPEC_MAX_ATTEMPTS, starts after which an item that keeps killing
            its worker is marked failed.
        visibility_timeout: APPLESPEC_VISIBILITY_TIMEOUT (s), after which Redis hands an
            unacknowledged chunk (its worker died) to another worker; well above a chunk's runtime.
        chunk_size: APPLESPEC_CHUNK_SIZE, items per Celery task.
        sweep_interval: APPLESPEC_SWEEP_INTERVAL (s), how often a worker checks that the broker
            still holds the queued chunks (it re-enqueues them after a broker restart lost them).
        serve_models: APPLESPEC_SERVE_MODELS, comma-separated model specs the HTTP API runs a
            batch on when its lines name one (`model` is always served); any other body.model
            runs on `model`.
        max_lines: APPLESPEC_MAX_LINES, the most requests a job file uploaded to the HTTP API
            (`POST /v1/files`) may hold.
        max_file_bytes: APPLESPEC_MAX_FILE_BYTES, the largest job file it takes.
    """

    database_url: str
    broker_url: str = "redis://127.0.0.1:6379/0"
    model: str = "smollm2-135m"
    max_attempts: int = 3
    visibility_timeout: int = 3600
    chunk_size: int = 8
    sweep_interval: float = 10.0
    serve_models: tuple[str, ...] = ()
    max_lines: int = 50_000
    max_file_bytes: int = 200 * (1 << 20)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Settings:
        def get(name: str, default: str) -> str:
            return env.get(f"APPLESPEC_{name}") or default

        return cls(
            database_url=get("DATABASE_URL", default_database_url(env)),
            broker_url=get("BROKER_URL", cls.broker_url),
            model=get("MODEL", cls.model),
            max_attempts=int(get("MAX_ATTEMPTS", str(cls.max_attempts))),
            visibility_timeout=int(get("VISIBILITY_TIMEOUT", str(cls.visibility_timeout))),
            chunk_size=int(get("CHUNK_SIZE", str(cls.chunk_size))),
            sweep_interval=float(get("SWEEP_INTERVAL", str(cls.sweep_interval))),
            serve_models=tuple(m.strip() for m in get("SERVE_MODELS", "").split(",") if m.strip()),
            max_lines=int(get("MAX_LINES", str(cls.max_lines))),
            max_file_bytes=int(get("MAX_FILE_BYTES", str(cls.max_file_bytes))),
        )
