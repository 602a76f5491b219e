"""The HTTP app factory: the OpenAI Batch API, the dashboard and /metrics on one store."""

from __future__ import annotations

import ipaddress
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from sqlalchemy import select

from core.settings import Settings

from . import batches, dashboard, errors, files, metrics
from .monitor import FarmMonitor


def is_loopback(host: str) -> bool:
    """Whether `host` (what `serve --host` binds) only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def create_app(
    settings: Settings | None = None, *, require_keys: bool = False, monitor: bool = True
) -> FastAPI:
    """The app for `settings` (default: from the environment).

    Args:
        require_keys: every API request needs an active key even when none were made
            (set by `serve` for a non-loopback host).
        monitor: poll the broker for workers and queue depth in a background thread.
    """
    from api.client import open_sessions
    from core.store.database import make_sessionmaker
    from core.store.models import JOB_DONE, Job

    settings = settings or Settings.from_env()
    sessions = open_sessions(settings.database_url)
    reader = make_sessionmaker(sessions.kw["bind"], readonly=True)

    def known_queues() -> list[str]:
        with reader() as s:
            return [
                q
                for q in s.scalars(select(Job.queue).where(Job.status.not_in(JOB_DONE)).distinct())
                if q
            ]

    farm = FarmMonitor(settings, known_queues) if monitor else None

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if farm is not None:
            farm.start()
        try:
            yield
        finally:
            if farm is not None:
                farm.stop()
            sessions.kw["bind"].dispose()

    app = FastAPI(
        title="AppleSpec",
        summary="OpenAI-compatible Batch API for speculative decoding on MLX",
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.sessions = sessions
    app.state.reader = reader
    app.state.require_keys = require_keys
    app.state.monitor = farm
    app.state.registry = metrics.registry_for(reader, farm)
    errors.install(app)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(dashboard.router)
    app.include_router(dashboard.signin_router)
    app.include_router(metrics.router)
    app.mount("/static", StaticFiles(directory=str(dashboard.HERE / "static")), name="static")
    return app
