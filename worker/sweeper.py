"""A worker bootstep that takes back what dead workers and lost brokers left behind.

Every `sweep_interval` seconds, in the worker's main process:

* presence: the worker records that it consumes its queues (`applespec wait` warns when no
  live worker consumes a job's queue);
* leases: items whose lease expired (their worker stopped beating: SIGKILL, host crash,
  OOM), or whose owner is a process of this host that no longer runs (a pool process
  killed outright: at once, not after the lease), are re-queued, or cancelled when their
  job is cancelling (`repo.reap_expired`);
* deliveries: a chunk the broker handed to a worker that died before leasing its items
  (SIGKILL in that moment) stays unacknowledged in Redis until the visibility timeout, an
  hour by default. A delivery older than a lease whose items nobody leased since is put
  back on its queue (`rescue`);
* broker epoch: the broker's epoch (worker/enqueue.py) is compared with the one each
  unfinished job was enqueued under. A job from an older epoch lost its queued chunks:
  one worker wins a conditional update and enqueues its open items again.

Items that were already done, or are leased to a live worker, are skipped by the task, so a
duplicate chunk costs nothing. The broker's visibility timeout stays as the last resort.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from datetime import UTC, datetime

from celery import bootsteps
from sqlalchemy import or_, select, update
from sqlalchemy.pool import NullPool

from core.store import repo
from core.store.database import StoreGone, make_engine, make_sessionmaker
from core.store.models import Job

from . import shutdown
from .app import TASK_NAME
from .enqueue import broker_epoch, enqueue
from .process import owner_is_dead

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


def reap(app, sessions) -> dict[str, list[int]]:
    """Re-enqueue the items whose lease expired; job id -> the item ids queued again."""
    settings = app.conf.applespec_settings
    with sessions() as session:
        requeue = repo.reap_expired(session, owner_dead=owner_is_dead)
        for job_id, ids in requeue.items():
            try:
                enqueue(app, session, job_id, ids, settings.chunk_size)
            except Exception:
                # The broker is down: the epoch sweep queues the job once it answers.
                session.rollback()
                session.execute(update(Job).where(Job.id == job_id).values(broker_epoch=None))
                session.commit()
                raise
            log.warning(
                "job %s: %d item(s) whose worker stopped beating queued again", job_id, len(ids)
            )
    return requeue


def rescue(app, sessions, queues) -> dict[str, list[int]]:
    """Put back on their queue the chunks of `queues` that a worker took from the broker more
    than a lease ago and whose items nobody leased since (that worker died first); job id ->
    those items. A live worker leases a chunk's items as it receives it; should one be that
    slow, the chunk it gets twice is skipped where leased, so nothing runs twice."""
    settings = app.conf.applespec_settings
    rescued: dict[str, list[int]] = {}
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        client = channel.client
        before = time.time() - settings.lease_timeout
        for tag, at in client.zrangebyscore(
            channel.unacked_index_key, "-inf", before, withscores=True
        ):
            raw = client.hget(channel.unacked_key, tag)
            if raw is None:  # acknowledged or restored meanwhile
                continue
            payload, _exchange, routing_key = json.loads(raw)
            message = channel.Message(payload, channel=channel)
            if routing_key not in queues or message.headers.get("task") != TASK_NAME:
                continue
            (job_id, item_ids), _kwargs, _embed = message.decode()
            with sessions() as session:
                ids = repo.never_leased(session, job_id, item_ids, datetime.fromtimestamp(at, UTC))
            if ids:
                channel.qos.restore_by_tag(tag, client=client)
                rescued[job_id] = ids
                log.warning(
                    "job %s: %d item(s) whose worker died as it received them queued again",
                    job_id,
                    len(ids),
                )
    return rescued


def presence_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Sweeper(bootsteps.StartStopStep):
    """Runs `reap`, `rescue` and `sweep` on the worker's timer (main process; no model there)."""

    requires = {"celery.worker.components:Timer"}

    def __init__(self, worker, **kwargs):
        super().__init__(worker, **kwargs)
        self.tref = None
        self.sessions = None

    def start(self, worker) -> None:
        app = worker.app
        settings = app.conf.applespec_settings
        # Its own pool without kept connections: pool processes are forked from this one.
        self.sessions = make_sessionmaker(make_engine(settings.database_url, poolclass=NullPool))
        queues = sorted(app.amqp.queues.consume_from or [app.conf.task_default_queue])
        ttl = 3 * settings.sweep_interval + 2
        shutdown.install(worker)

        def tick() -> None:
            try:
                with self.sessions() as session:
                    repo.worker_seen(session, presence_name(), queues, ttl)
                reap(app, self.sessions)
                rescue(app, self.sessions, queues)
                sweep(app, self.sessions)
            except StoreGone as e:
                log.error("%s: stopping this worker", e)
                if self.tref is not None:
                    self.tref.cancel()
                shutdown.stop_worker()
            except Exception as e:  # broker or database down: try again next tick
                log.warning("sweep skipped: %s", settings.redact(f"{type(e).__name__}: {e}"))

        tick()
        self.tref = worker.timer.call_repeatedly(settings.sweep_interval, tick, priority=10)

    def stop(self, worker) -> None:
        if self.tref is not None:
            self.tref.cancel()
        if self.sessions is not None:
            try:
                with self.sessions() as session:
                    repo.worker_gone(session, presence_name())
            except Exception as e:  # the store is gone or down: nothing to mark
                log.warning("could not mark this worker gone: %s: %s", type(e).__name__, e)
