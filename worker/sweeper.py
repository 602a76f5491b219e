"""A worker bootstep that re-enqueues jobs a broker restart lost.

Every `sweep_interval` seconds the worker compares the broker's epoch (worker/enqueue.py)
with the one each unfinished job was enqueued under. A job from an older epoch lost its
queued chunks: one worker wins a conditional update and enqueues its open items again.
Items that were already done are skipped by the task, so a duplicate chunk costs nothing.
"""

from __future__ import annotations

import logging

from celery import bootsteps
from sqlalchemy import or_, select, update
from sqlalchemy.pool import NullPool

from core.store import repo
from core.store.database import make_engine, make_sessionmaker
from core.store.models import Job

from .enqueue import broker_epoch, enqueue

log = logging.getLogger(__name__)


def sweep(app, sessions) -> list[str]:
    """Re-enqueue the open items of in-progress jobs from an older broker epoch; their ids."""
    settings = app.conf.applespec_settings
    epoch = broker_epoch(settings.broker_url)
    requeued = []
    with sessions() as session:
        stale = session.execute(
            select(Job.id, Job.broker_epoch).where(
                Job.status == "in_progress",
                Job.mode == "service",
                or_(Job.broker_epoch.is_(None), Job.broker_epoch != epoch),
            )
        ).all()
        for job_id, old in stale:
            won = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.broker_epoch.is_not_distinct_from(old))
                .values(broker_epoch=epoch)
            ).rowcount
            session.commit()
            if won != 1:
                continue
            ids = repo.open_item_ids(session, job_id, ("pending", "running"))
            enqueue(app, session, job_id, ids, settings.chunk_size)
            log.warning("broker lost job %s: re-enqueued %d items", job_id, len(ids))
            requeued.append(job_id)
    return requeued


class Sweeper(bootsteps.StartStopStep):
    """Runs `sweep` on the worker's timer (main process; no model there)."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.tref = None

    def start(self, worker) -> None:
        app = worker.app
        # Its own pool without kept connections: pool processes are forked from this one.
        url = app.conf.applespec_settings.database_url
        sessions = make_sessionmaker(make_engine(url, poolclass=NullPool))

        def tick() -> None:
            try:
                sweep(app, sessions)
            except Exception as e:  # broker or database down: try again next tick
                log.warning("sweep skipped: %s: %s", type(e).__name__, e)

        interval = app.conf.applespec_settings.sweep_interval
        self.tref = worker.timer.call_repeatedly(interval, tick, priority=10)

    def stop(self, worker) -> None:
        if self.tref is not None:
            self.tref.cancel()
