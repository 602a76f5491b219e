"""The chunk task: lease a job's items, run them one by one, idempotently, committing each.

The task is thin: leases, claims and hand-backs are `core.store.repo` functions and the
heartbeat is `worker.heartbeat`, so a batched engine can call the same pieces.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import threading
import time

from celery import Celery
from celery.exceptions import Reject
from sqlalchemy.exc import OperationalError

from core.draft_policy import resolve_draft
from core.energy import EnergyClock, find_meter
from core.jobs import generation_params, prompt_tokens
from core.settings import Settings
from core.store import repo
from core.store.database import StoreGone, make_engine, make_sessionmaker

from . import shutdown
from .app import TASK_NAME
from .enqueue import hand_back
from .heartbeat import Heartbeat
from .hooks import item_hook
from .process import (
    Started,
    owner_is_dead,
    start_item,
    store_error,
    store_result,
    worker_name,
)
from .runtime import Cancelled, Work, runtime

log = logging.getLogger(__name__)
SHARE_EVERY_S = 2.0  # how often a worker reads a job's answers stored by the others
SHUTDOWN_DRAIN_S = (
    30.0  # rows in flight at a warm shutdown finish within this (Celery's soft timeout)
)


def _sessions(url: str):
    """One connection pool per process: a pool made before a fork must not be shared."""
    return _sessions_in(url, os.getpid())


@functools.cache
def _sessions_in(url: str, pid: int):
    return make_sessionmaker(make_engine(url))


def runtime_for(settings: Settings):
    """This process's Runtime, made with the settings' batch size and learning share."""
    return runtime(settings.batch_size, settings.learn_share, settings.kv_budget_bytes)


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
        on_cancelled=lambda ids: runtime_for(settings).cancel(ids),
    )


class Writer:
    """Stores finished items from a thread of its own (the engine thread never waits on the
    database) and lets the heartbeat drop them. After a result it reads the answers other
    workers stored for the job since (every `SHARE_EVERY_S` per job at most) into the job's
    suffix index, and drops the index once the job is done."""

    def __init__(self, settings: Settings, beat: Heartbeat):
        self.settings = settings
        self.sessions = _sessions(settings.database_url)
        self.beat = beat
        self.worker = worker_name()
        self.energy = EnergyClock(find_meter())  # None readings where nothing is readable
        self._seen: dict[str, tuple[int, float]] = {}  # job -> (last result id, when read)
        self._q: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="applespec-writer", daemon=True)
        self._thread.start()

    def done(self, work: Work, result, error) -> None:
        # Called on the engine thread as the row finishes: the energy since the last finish.
        joules = self.energy.split() if error is None else None
        self._q.put((work.tag, result, error, (joules, self.energy.source)))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything handed in so far is stored."""
        self._q.put(None)
        deadline = time.monotonic() + timeout
        while self._q.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _run(self) -> None:
        while True:
            entry = self._q.get()
            try:
                if entry is not None:
                    self._store(*entry)
            except StoreGone as e:
                log.error("%s: stopping this worker", e)
                shutdown.stop_worker()
            except Exception:  # the lease runs out and the item is queued again
                log.exception("storing an item failed")
            finally:
                self._q.task_done()

    def _store(self, started: Started, result, error, energy=(None, None)) -> None:
        try:
            with self.sessions() as session:
                if isinstance(error, Cancelled):
                    repo.cancel_item(session, started.item_id)
                elif error is not None:
                    store_error(session, started, error)
                else:
                    store_result(session, started, result, self.worker, energy)
            if error is None:
                self._share(started)
        finally:
            self.beat.drop([started.item_id])

    def _share(self, started: Started) -> None:
        job = started.job_id
        after, when = self._seen.get(job, (0, 0.0))
        if time.monotonic() - when < SHARE_EVERY_S:
            return
        with self.sessions() as session:
            texts, last, done = repo.answers_since(session, job, after, not_worker=self.worker)
        rt = runtime_for(self.settings)
        if done:
            self._seen.pop(job, None)
            rt.forget(job)
            return
        self._seen[job] = (last, time.monotonic())
        if self.settings.share_answers:
            rt.share(_engine_key(self.settings, started), job, texts)


def writer(settings: Settings) -> Writer:
    """This process's writer (started on first use, after the fork)."""
    return _writer_in(settings, os.getpid())


@functools.cache
def _writer_in(settings: Settings, pid: int) -> Writer:
    return Writer(settings, heartbeat(settings))


def _engine_key(settings: Settings, started: Started) -> tuple[str, str, int | None]:
    # The drafter is checked again here: a job row may come from an older client.
    return started.job_model, resolve_draft(started.drafter, settings), started.k


def run_chunk(
    settings: Settings, job_id: str, item_ids: list[int], app: Celery | None = None
) -> dict[str, int]:
    """Lease the chunk's items and hand them to this process's continuous batch.

    Returns once every item is handed over (or skipped): the next chunk then arrives while
    these run, so several chunks feed one batch. Each item is stored as its row finishes
    (by the writer thread); the heartbeat keeps the leases alive meanwhile, and a dead
    process's items are re-queued by the sweeper when their leases expire. A chunk
    redelivered while this one runs skips its items. The job's status is checked as each
    item is claimed, so a cancel stops the rest. On a warm shutdown the rest of the chunk
    is released and queued again (with `app`). Database errors propagate (retried).

    Returns:
        Counts: submitted (handed to the engine), failed (before running), skipped (done
        or held elsewhere), handed_back.
    """
    sessions = _sessions(settings.database_url)
    worker = worker_name()
    beat = heartbeat(settings)
    rt = runtime_for(settings)
    out = writer(settings)
    counts = {"submitted": 0, "failed": 0, "skipped": 0, "handed_back": 0}
    with sessions() as session:
        leased = repo.lease_items(
            session, job_id, item_ids, worker, settings.lease_timeout, owner_is_dead
        )
    mine = beat.hold(leased)
    counts["skipped"] = len(item_ids) - len(mine)
    for n, item_id in enumerate(mine):
        while not shutdown.requested() and not rt.wait_for_room(timeout=1.0):
            pass  # a full backlog: this chunk waits on the broker's side
        if shutdown.requested() and app is not None:
            with sessions() as session:
                counts["handed_back"] = hand_back(
                    app, session, job_id, mine[n:], worker, settings.chunk_size
                )
            beat.drop(mine[n:])
            break
        with sessions() as session:
            started = start_item(
                session,
                item_id,
                max_attempts=settings.max_attempts,
                worker_host=worker,
                lease_s=settings.lease_timeout,
                owner_dead=owner_is_dead,
            )
        if started is None:
            beat.drop([item_id])
            counts["skipped"] += 1
            continue
        try:
            key = _engine_key(settings, started)
        except Exception as e:  # a bad drafter fails the item alone
            with sessions() as session:
                store_error(session, started, e)
            beat.drop([item_id])
            counts["failed"] += 1
            continue
        request = started.request
        work = Work(
            key=key,
            prompt=lambda target, r=request: prompt_tokens(target, r),
            # Built on the engine thread: it imports core.engine (MLX), whose streams belong
            # to the thread that made them. A bad parameter fails the item alone there.
            params=functools.partial(generation_params, request),
            done=out.done,
            on_admit=item_hook(started.custom_id),
            tag=started,
            id=started.item_id,
            job=job_id,
        )
        if started.attempt > 1:
            # It was running when a worker died: it may be what killed it. It runs alone,
            # so if it kills this process too no other item is charged an attempt.
            while not rt.submit_alone(work, timeout=1.0, settle=out.flush):
                if shutdown.requested() and app is not None:
                    break
            else:
                counts["submitted"] += 1
                continue
            with sessions() as session:  # not started: its attempt is given back
                counts["handed_back"] = hand_back(
                    app, session, job_id, mine[n:], worker, settings.chunk_size
                )
            beat.drop(mine[n:])
            break
        if rt.outstanding == 0:  # idle until now: its energy is nobody's
            out.energy.mark()
        rt.submit(work)
        counts["submitted"] += 1
    log.info("job %s chunk of %d: %s", job_id, len(item_ids), counts)
    return counts


def hand_back_all(settings: Settings, app: Celery | None) -> int:
    """A warm shutdown of this process: hand back what waits in the engine's queue, let the
    rows in flight finish and their results be stored. Returns the items handed back."""
    rt = runtime_for(settings)
    taken = rt.take_back()
    n = 0
    if taken and app is not None:
        sessions = _sessions(settings.database_url)
        by_job: dict[str, list[int]] = {}
        for w in taken:
            by_job.setdefault(w.tag.job_id, []).append(w.tag.item_id)
        with sessions() as session:
            for job_id, ids in by_job.items():
                n += hand_back(app, session, job_id, ids, worker_name(), settings.chunk_size)
        heartbeat(settings).drop([w.tag.item_id for w in taken])
    rt.drain(timeout=SHUTDOWN_DRAIN_S)
    writer(settings).flush()
    return n


def register(app: Celery, settings: Settings) -> None:
    """Add the chunk task to `app`, and the pool process's warm exit (`hand_back_all`)."""
    from celery import signals

    def on_exit(**_kwargs) -> None:
        try:
            handed = hand_back_all(settings, app)
            log.info("handed %d queued item(s) back on shutdown", handed)
        except Exception:  # the leases run out and the sweeper re-queues the items
            log.exception("handing items back on shutdown failed")

    signals.worker_process_shutdown.connect(
        on_exit, weak=False, dispatch_uid=f"applespec-exit-{id(app)}"
    )

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
