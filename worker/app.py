"""The Celery app factory: JSON only, late acks, one queue per model."""

from __future__ import annotations

import re

from celery import Celery

from core.settings import Settings

TASK_NAME = "applespec.run_chunk"


def queue_name(model: str) -> str:
    """The queue for a model spec: `applespec.<spec with unsafe characters as _>`."""
    return "applespec." + re.sub(r"[^A-Za-z0-9_.:-]+", "_", model).strip("_")


def create_app(settings: Settings | None = None) -> Celery:
    """A Celery app for `settings` (default: from the environment), with the chunk task."""
    settings = settings or Settings.from_env()
    app = Celery("applespec", broker=settings.broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # A chunk is acknowledged once its items are leased and handed to the process's
        # engine; from then on the leases (renewed by the heartbeat) guard them, and a dead
        # worker's items are re-queued by the sweeper when their leases expire.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # Redis re-delivers an unacknowledged chunk after this: the last resort behind leases
        # (a redelivered chunk skips the items a live worker holds).
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout,
            # Look for a dead worker's chunks every few seconds, not every 100 s.
            "unacked_restore_interval": min(10, max(1, settings.visibility_timeout // 4)),
            "unacked_restore_throttle": 1,
        },
        broker_connection_retry_on_startup=True,
        # On SIGTERM a chunk finishes its item in progress and hands the rest back
        # (worker/shutdown.py); on a cold shutdown, running items get this long.
        worker_soft_shutdown_timeout=30.0,
        worker_enable_soft_shutdown_on_idle=True,
        task_default_queue=queue_name(settings.model),
        worker_hijack_root_logger=False,
    )
    app.conf.applespec_settings = settings

    from . import shutdown
    from .sweeper import Sweeper
    from .tasks import register

    register(app, settings)
    shutdown.connect()
    app.steps["worker"].add(Sweeper)
    return app
