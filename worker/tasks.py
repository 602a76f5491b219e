"""The chunk task: lease a job's items, run them one by one, idempotently, committing each.

The task is thin: leases, claims and hand-backs are `core.store.repo` functions and the
heartbeat is `worker.heartbeat`, so a batched engine can call the same pieces.
"""

from __future__ import annotations

import functools
import logging
import os

from celery import Celery
from celery.exceptions import Reject
from sqlalchemy.exc import OperationalError

from core.draft_policy import resolve_draft
from core.settings import Settings
from core.store import repo
from core.store.database import StoreGone, make_engine, make_sessionmaker

from . import shutdown
from .app import TASK_NAME
from .enqueue import hand_back
from .heartbeat import Heartbeat
from .process import owner_is_dead, process_item, worker_name
from .runtime import engine_for

log = logging.getLogger(__name__)


def _sessions(url: str):
    """One connection pool per process: a pool made before a fork must not be shared."""
    return _sessions_in(url, os.getpid())


@functools.cache
def _sessions_in(url: str, pid: int):
    return make_sessionmaker(make_engine(url))


def heartbeat(settings: Settings) -> Heartbeat:
    """This process's heartbeat (one per process, started on first use, after the fork)."""
    return _heartbeat_in(settings, os.getpid())


@functools.cache
def _heartbeat_in(settings: Settings, pid: int) -> Heartbeat:
    def store_gone(e: StoreGone) -> None:
        log.error("%s: stopping this worker", e)
        shutdown.stop_worker()

    return Heartbeat(
        _sessions(settings.database_url),
        worker_name(),
        settings.lease_timeout,
        settings.heartbeat_interval,
        on_store_gone=store_gone,
    )


def _engine_for(settings: Settings, job):
    # The drafter is checked again here: a job row may come from an older client.
    return engine_for(job.model, resolve_draft(job.drafter, settings), job.k)


def run_chunk(
    settings: Settings, job_id: str, item_ids: list[int], app: Celery | None = None
) -> dict[str, int]:
    """Run the chunk's items that are not done yet and not leased to a live worker.

    The chunk is leased whole at the start (renewed by this process's heartbeat): a chunk
    redelivered while this one runs skips its items. The job's status is checked before
    each item, so a cancel stops the rest. On a warm shutdown the item in progress
    finishes and the rest is released and queued again (with `app`). Database errors
    propagate (the task retries).

    Returns:
        Counts by outcome: completed, failed, skipped (done or held elsewhere), handed_back.
    """
    sessions = _sessions(settings.database_url)
    worker = worker_name()
    beat = heartbeat(settings)
    counts = {"completed": 0, "failed": 0, "skipped": 0, "handed_back": 0}
    with sessions() as session:
        leased = repo.lease_items(
            session, job_id, item_ids, worker, settings.lease_timeout, owner_is_dead
        )
    mine = beat.hold(leased)
    counts["skipped"] = len(item_ids) - len(mine)
    try:
        for n, item_id in enumerate(mine):
            if shutdown.requested() and app is not None:
                with sessions() as session:
                    counts["handed_back"] = hand_back(
                        app, session, job_id, mine[n:], worker, settings.chunk_size
                    )
                break
            with sessions() as session:
                outcome = process_item(
                    session,
                    item_id,
                    engine_for=lambda job: _engine_for(settings, job),
                    max_attempts=settings.max_attempts,
                    worker_host=worker,
                    lease_s=settings.lease_timeout,
                    owner_dead=owner_is_dead,
                )
            beat.drop([item_id])
            if outcome is None:
                counts["skipped"] += 1
            else:
                counts["failed" if outcome.error else "completed"] += 1
    finally:
        beat.drop(mine)
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
        try:
            return run_chunk(settings, job_id, item_ids, app)
        except StoreGone as e:
            # Write nothing into a deleted or replaced file: stop, and leave the chunk queued.
            log.error("%s: stopping this worker; the chunk goes back to the queue", e)
            shutdown.stop_worker()
            raise Reject(str(e), requeue=True) from e
