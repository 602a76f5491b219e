"""The chunk task: run a job's items one by one, idempotently, committing each."""

from __future__ import annotations

import functools
import logging
import os

from celery import Celery
from sqlalchemy.exc import OperationalError

from core.settings import Settings
from core.store.database import make_engine, make_sessionmaker

from .app import TASK_NAME
from .process import process_item
from .runtime import engine_for

log = logging.getLogger(__name__)


def _sessions(url: str):
    """One connection pool per process: a pool made before a fork must not be shared."""
    return _sessions_in(url, os.getpid())


@functools.cache
def _sessions_in(url: str, pid: int):
    return make_sessionmaker(make_engine(url))


def run_chunk(settings: Settings, job_id: str, item_ids: list[int]) -> dict[str, int]:
    """Run the chunk's items that are not done yet; returns counts by outcome.

    Items already completed (a redelivered chunk) are skipped; the job's status is checked
    before each item, so a cancel stops the rest. Database errors propagate (retried).
    """
    sessions = _sessions(settings.database_url)
    counts = {"completed": 0, "failed": 0, "skipped": 0}
    for item_id in item_ids:
        with sessions() as session:
            outcome = process_item(
                session,
                item_id,
                engine_for=lambda job: engine_for(job.model, job.drafter, job.k),
                max_attempts=settings.max_attempts,
            )
        if outcome is None:
            counts["skipped"] += 1
        else:
            counts["failed" if outcome.error else "completed"] += 1
    log.info("job %s chunk of %d: %s", job_id, len(item_ids), counts)
    return counts


def register(app: Celery, settings: Settings) -> None:
    """Add the chunk task to `app`."""

    @app.task(
        name=TASK_NAME,
        shared=False,  # bound to this app and its settings, not to every app made later
        autoretry_for=(OperationalError,),
        retry_backoff=True,
        retry_backoff_max=60,
        max_retries=8,
    )
    def run_chunk_task(job_id: str, item_ids: list[int]) -> dict[str, int]:
        return run_chunk(settings, job_id, item_ids)
