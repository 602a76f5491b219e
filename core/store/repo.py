"""What the CLI and the workers do to the store: jobs, item life cycle, derived job status."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import case, func, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.jobs import JobRequest, LineError, output_line

from .models import ITEM_DONE, JOB_DONE, Item, Job, Metric, Result, WorkerPresence, utcnow


class UnknownJob(LookupError):
    """No job with this id."""


def new_job_id() -> str:
    return f"batch_{uuid.uuid4().hex}"


def aware(dt: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every timestamp we store is UTC."""
    return dt.replace(tzinfo=UTC) if dt is not None and dt.tzinfo is None else dt


def create_job(
    session: Session,
    *,
    model: str,
    requests: list[JobRequest],
    errors: list[LineError],
    drafter: str = "auto",
    k: int | None = None,
    params: dict[str, Any] | None = None,
    mode: str = "service",
    input_file: str | None = None,
    queue: str | None = None,
    job_id: str | None = None,
    idempotency_key: str | None = None,
    submission_hash: str | None = None,
) -> Job:
    """Store a job with one item per line: valid ones pending, bad ones `invalid` with their error.

    The job stays `validating` until the caller has enqueued it (`mark_in_progress`). With
    `idempotency_key`, a second job under the same key fails at the first flush
    (IntegrityError), before any item is written.
    """
    job = Job(
        id=job_id or new_job_id(),
        model=model,
        drafter=drafter,
        k=k,
        params={k_: v for k_, v in (params or {}).items() if v is not None},
        mode=mode,
        input_file=storable_text(input_file, 1024) if input_file else None,
        queue=queue,
        idempotency_key=idempotency_key,
        submission_hash=submission_hash,
        status="validating",
        total=len(requests) + len(errors),
    )
    session.add(job)
    session.flush()
    now = utcnow()
    rows = [
        {
            "job_id": job.id,
            "line": r.line,
            "custom_id": r.custom_id,
            "request": r.to_dict(),
            "status": "pending",
            "attempts": 0,
        }
        for r in requests
    ]
    rows += [
        {
            "job_id": job.id,
            "line": e.line,
            "custom_id": e.custom_id,
            "request": None,
            "status": "invalid",
            "attempts": 0,
            "error_code": e.code,
            "error_message": storable_text(e.message),
            "finished_at": now,
        }
        for e in errors
    ]
    if rows:  # one multi-row INSERT per batch, not one ORM object per line
        session.execute(insert(Item), rows)
    refresh_job(session, job.id)
    return job


def get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise UnknownJob(f"no job {job_id!r}")
    return job


def mark_in_progress(session: Session, job_id: str, broker_epoch: str | None = None) -> None:
    """The job's chunks are queued: `validating` -> `in_progress` (unless already finished)."""
    job = get_job(session, job_id)
    job.broker_epoch = broker_epoch
    if job.status == "validating":
        job.status = "in_progress"
        job.in_progress_at = utcnow()
    session.flush()
    refresh_job(session, job_id)


def refresh_job(session: Session, job_id: str) -> Job:
    """Recount a job's items and derive its status from the counts (no chords, no callbacks).

    Call it in a transaction that has already written (SQLite then holds the write lock; on
    PostgreSQL the job row is locked here), so concurrent workers never overwrite fresher counts.
    """
    job = session.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one()
    counts = dict(
        session.execute(
            select(Item.status, func.count()).where(Item.job_id == job_id).group_by(Item.status)
        ).all()
    )
    job.total = sum(counts.values())
    job.completed = counts.get("completed", 0)
    job.failed = counts.get("failed", 0) + counts.get("invalid", 0)
    open_items = counts.get("pending", 0) + counts.get("running", 0)
    now = utcnow()
    if open_items == 0 and job.status not in JOB_DONE:
        if job.status in ("cancelling", "cancelled") or counts.get("cancelled", 0):
            job.status, job.cancelled_at = "cancelled", now
        elif job.completed == 0:
            job.status, job.failed_at = "failed", now
        else:
            job.status, job.completed_at = "completed", now
            job.finalizing_at = job.finalizing_at or now
    session.flush()
    return job


def _cancelled_orphan(now: datetime) -> dict[str, Any]:
    """The columns of an item of a cancelled job whose worker had stopped."""
    return {
        "status": "cancelled",
        "error_code": "cancelled",
        "error_message": "cancelled; its worker had stopped",
        "finished_at": now,
        "lease_owner": None,
        "lease_expires_at": None,
    }


# A process that may be gone: host:pid -> True when it surely is (see worker/process.py).
OwnerDead = Callable[[str], bool]


def lease_until(lease_s: float) -> datetime:
    return utcnow() + timedelta(seconds=lease_s)


def _held_by_other(item: Item, worker: str, now: datetime, owner_dead: OwnerDead | None) -> bool:
    """Whether another live process holds `item`'s lease (then it must not run here)."""
    if item.lease_owner is None or item.lease_owner == worker:
        return False
    expires = aware(item.lease_expires_at)
    if expires is None or expires <= now:
        return False
    return not (owner_dead is not None and owner_dead(item.lease_owner))


def lease_items(
    session: Session,
    job_id: str,
    item_ids: Iterable[int],
    worker: str,
    lease_s: float,
    owner_dead: OwnerDead | None = None,
) -> list[int]:
    """Reserve a chunk's items for `worker` (host:pid) for `lease_s` seconds; commits.

    Items of another job, done items and items whose lease another live worker holds (a
    chunk redelivered while its first worker still runs it) are left out. A heartbeat
    (`renew_leases`) keeps the reservation; when it stops, the sweeper re-queues the items
    (`reap_expired`).

    Returns:
        The ids now leased to `worker`, in chunk order.
    """
    ids = list(item_ids)
    now = utcnow()
    taken = []
    for i in range(0, len(ids), 500):  # bounded IN lists
        batch = ids[i : i + 500]
        rows = session.scalars(
            select(Item).where(Item.id.in_(batch), Item.job_id == job_id).with_for_update()
        ).all()
        taken += [
            it.id
            for it in rows
            if it.status not in ITEM_DONE and not _held_by_other(it, worker, now, owner_dead)
        ]
    order = {item_id: n for n, item_id in enumerate(ids)}
    taken.sort(key=order.__getitem__)
    for i in range(0, len(taken), 500):
        session.execute(
            update(Item)
            .where(Item.id.in_(taken[i : i + 500]))
            .values(lease_owner=worker, lease_expires_at=lease_until(lease_s)),
            execution_options={"synchronize_session": False},
        )
    session.commit()
    return taken


def claim_item(
    session: Session,
    item_id: int,
    worker: str | None,
    lease_s: float | None,
    max_attempts: int,
    owner_dead: OwnerDead | None = None,
) -> Item | None:
    """Start an item on `worker`: None when it is done, cancelled, out of attempts, or
    leased by another live worker. Commits.

    Attempts are counted here, before the engine runs, so an item that kills its worker is
    seen on redelivery; after `max_attempts` starts it is marked failed. With `lease_s`
    the item is leased to `worker` (renewed by its heartbeat); None starts it without a
    lease (`applespec run`, which no sweeper watches).
    """
    item = session.execute(select(Item).where(Item.id == item_id).with_for_update()).scalar_one()
    if item.status in ITEM_DONE:
        session.commit()
        return None
    if worker is not None and _held_by_other(item, worker, utcnow(), owner_dead):
        session.commit()
        return None
    job = item.job
    if job.status in ("cancelling", "cancelled"):
        _close(item, "cancelled", "cancelled", f"line {item.line}: the job was cancelled")
    elif item.attempts >= max_attempts:
        _close(
            item,
            "failed",
            "max_attempts_exceeded",
            f"line {item.line}: gave up after {item.attempts} attempts "
            "(the worker running it died each time)",
        )
    else:
        item.attempts += 1
        item.status = "running"
        item.worker = worker
        item.started_at = utcnow()
        leased = lease_s is not None and worker is not None
        item.lease_owner = worker if leased else None
        item.lease_expires_at = lease_until(lease_s) if leased else None
        session.commit()  # a start changes no count: no job recount here
        return item
    session.flush()
    refresh_job(session, item.job_id)
    session.commit()
    return None


def start_item(
    session: Session, item_id: int, max_attempts: int, worker: str | None = None
) -> Item | None:
    """`claim_item` without a lease."""
    return claim_item(session, item_id, worker, None, max_attempts)


def renew_leases(
    session: Session, worker: str, item_ids: Iterable[int], lease_s: float
) -> set[int]:
    """Extend `worker`'s leases on `item_ids` by `lease_s` from now; commits.

    Returns:
        The ids still leased to `worker`; the others were finished, or taken over by another
        worker after this one's lease had expired.
    """
    ids = list(item_ids)
    renewed: set[int] = set()
    for i in range(0, len(ids), 500):
        renewed |= set(
            session.scalars(
                update(Item)
                .where(
                    Item.id.in_(ids[i : i + 500]),
                    Item.lease_owner == worker,
                    Item.status.in_(("pending", "running")),
                )
                .values(lease_expires_at=lease_until(lease_s))
                .returning(Item.id),
                execution_options={"synchronize_session": False},
            )
        )
    session.commit()
    return renewed


def release_items(session: Session, item_ids: Iterable[int], worker: str) -> list[int]:
    """Hand `worker`'s leased, unfinished items back (a warm shutdown); commits.

    They become pending without a lease, for whoever enqueues them next; a started item
    gets its attempt back (it was stopped, it did not crash). The caller re-enqueues them.

    Returns:
        The ids released.
    """
    ids = list(item_ids)
    released: list[int] = []
    for i in range(0, len(ids), 500):
        mine = (
            Item.id.in_(ids[i : i + 500]),
            Item.lease_owner == worker,
            Item.status.in_(("pending", "running")),
        )
        started = session.scalars(select(Item.id).where(*mine, Item.status == "running")).all()
        if started:
            session.execute(
                update(Item)
                .where(Item.id.in_(started), Item.attempts > 0)
                .values(attempts=Item.attempts - 1),
                execution_options={"synchronize_session": False},
            )
        released += session.scalars(
            update(Item)
            .where(*mine)
            .values(status="pending", lease_owner=None, lease_expires_at=None, started_at=None)
            .returning(Item.id),
            execution_options={"synchronize_session": False},
        ).all()
    session.commit()
    return sorted(released)


def _gone(session: Session, now: datetime, owner_dead: OwnerDead | None, only=()):
    """The condition for leased open items whose worker is gone: the lease expired, or its
    owner is a process of this host that no longer runs (`owner_dead`)."""
    expired = Item.lease_expires_at < now
    if owner_dead is None:
        return expired
    owners = session.scalars(
        select(Item.lease_owner)
        .where(Item.status.in_(("pending", "running")), Item.lease_owner.is_not(None), *only)
        .distinct()
    ).all()
    dead = [o for o in owners if owner_dead(o)]
    return or_(expired, Item.lease_owner.in_(dead)) if dead else expired


def expired_items(
    session: Session,
    now: datetime | None = None,
    job_id: str | None = None,
    owner_dead: OwnerDead | None = None,
) -> list[tuple[str, int]]:
    """(job_id, item_id) of open items of service jobs (or of `job_id`) whose lease expired
    (or, with `owner_dead`, whose owner is known dead)."""
    now = now or utcnow()
    only = () if job_id is None else (Item.job_id == job_id,)
    gone = _gone(session, now, owner_dead, only)
    return [
        (job_id, item_id)
        for job_id, item_id in session.execute(
            select(Item.job_id, Item.id)
            .join(Job, Job.id == Item.job_id)
            .where(
                Item.status.in_(("pending", "running")),
                Item.lease_owner.is_not(None),
                gone,
                Job.mode == "service",
                *only,
            )
            .order_by(Item.job_id, Item.line)
        )
    ]


def reap_expired(
    session: Session, now: datetime | None = None, owner_dead: OwnerDead | None = None
) -> dict[str, list[int]]:
    """Take back the items whose worker stopped beating (or, with `owner_dead`, whose worker
    process of this host is gone: a pool process killed outright); commits.

    Items of a cancelling job are cancelled (so the job ends `cancelled`); the others become
    pending without a lease. The update is conditional, so when several sweepers run at
    once each item is taken back by exactly one.

    Returns:
        job id -> the item ids to enqueue again.
    """
    now = now or utcnow()
    gone = _gone(session, now, owner_dead)
    expired = expired_items(session, now, owner_dead=owner_dead)
    by_job: dict[str, list[int]] = {}
    for job_id, item_id in expired:
        by_job.setdefault(job_id, []).append(item_id)
    requeue: dict[str, list[int]] = {}
    for job_id, ids in by_job.items():
        status = session.scalar(select(Job.status).where(Job.id == job_id))
        still = (
            Item.id.in_(ids),
            Item.status.in_(("pending", "running")),
            Item.lease_owner.is_not(None),
            gone,
        )
        if status in ("cancelling", "cancelled"):
            session.execute(
                update(Item).where(*still).values(**_cancelled_orphan(now)),
                execution_options={"synchronize_session": False},
            )
            refresh_job(session, job_id)
        elif status == "in_progress":
            won = session.scalars(
                update(Item)
                .where(*still)
                .values(status="pending", lease_owner=None, lease_expires_at=None, queued_at=now)
                .returning(Item.id),
                execution_options={"synchronize_session": False},
            ).all()
            if won:
                requeue[job_id] = sorted(won)
        session.commit()
    return requeue


def never_leased(
    session: Session, job_id: str, item_ids: Iterable[int], delivered_at: datetime
) -> list[int]:
    """The items of a chunk delivered at `delivered_at` that no worker has leased since: still
    pending, without a lease, and queued no later than that delivery (an item queued again
    after it travels in a newer chunk). The ids, sorted."""
    ids = list(item_ids)
    found = []
    for i in range(0, len(ids), 500):  # bounded IN lists
        rows = session.execute(
            select(Item.id, Item.queued_at).where(
                Item.id.in_(ids[i : i + 500]),
                Item.job_id == job_id,
                Item.status == "pending",
                Item.lease_owner.is_(None),
            )
        ).all()
        found += [i for i, queued in rows if (aware(queued) or delivered_at) <= delivered_at]
    return sorted(found)


def finish_item(
    session: Session,
    item: Item,
    body: dict[str, Any],
    metric: dict[str, Any],
) -> bool:
    """Store an item's result and metrics once; a second write for the same item is a no-op.

    Returns:
        True when this call stored the result, False when one was already there.
    """
    usage = body["usage"]
    row = {
        "item_id": item.id,
        "body": body,
        "finish_reason": body["choices"][0]["finish_reason"],
        "prompt_tokens": usage["prompt_tokens"],
        "completion_tokens": usage["completion_tokens"],
        "total_tokens": usage["total_tokens"],
        "created_at": utcnow(),
    }
    stored = _insert_once(session, Result, row)
    if stored:
        _insert_once(session, Metric, {"item_id": item.id, "created_at": utcnow(), **metric})
    session.execute(
        update(Item)
        .where(Item.id == item.id)
        .values(
            status="completed",
            finished_at=utcnow(),
            error_code=None,
            error_message=None,
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    refresh_job(session, item.job_id)
    session.commit()
    return stored


def _insert_once(session: Session, model: type, row: dict[str, Any]) -> bool:
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(model).values(**row).on_conflict_do_nothing(index_elements=["item_id"])
    return session.execute(stmt.returning(model.id)).scalar() is not None


def fail_item(session: Session, item_id: int, code: str, message: str) -> None:
    """Mark one item failed with its error (a bad item fails alone). Commits."""
    item = session.get(Item, item_id)
    if item is None or item.status in ITEM_DONE:
        session.rollback()
        return
    _close(item, "failed", code, message)
    session.flush()
    refresh_job(session, item.job_id)
    session.commit()


def cancelled_items(session: Session, item_ids: Iterable[int]) -> set[int]:
    """Of `item_ids`, those whose job is cancelling or cancelled (a worker drops them)."""
    ids = list(item_ids)
    out: set[int] = set()
    for i in range(0, len(ids), 500):
        out |= set(
            session.scalars(
                select(Item.id)
                .join(Job, Job.id == Item.job_id)
                .where(Item.id.in_(ids[i : i + 500]), Job.status.in_(("cancelling", "cancelled")))
            )
        )
    session.rollback()
    return out


def cancel_item(session: Session, item_id: int) -> None:
    """Close an unfinished item of a cancelled job that its worker dropped before running
    it; commits (the job may now end `cancelled`)."""
    item = session.get(Item, item_id)
    if item is None or item.status in ITEM_DONE:
        session.rollback()
        return
    _close(item, "cancelled", "cancelled", f"line {item.line}: the job was cancelled")
    session.flush()
    refresh_job(session, item.job_id)
    session.commit()


def _close(item: Item, status: str, code: str, message: str) -> None:
    item.status = status
    item.error_code = code
    item.error_message = storable_text(message)
    item.finished_at = utcnow()
    item.lease_owner = None
    item.lease_expires_at = None


def storable_text(text: str, limit: int | None = None) -> str:
    """`text` as both stores can hold it: NUL and lone surrogates escaped, at most `limit`
    characters (an error message quoting an engine exception may carry anything)."""
    text = text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    return text if limit is None or len(text) <= limit else text[: limit - 3] + "..."


def answers_since(
    session: Session, job_id: str, after_id: int, not_worker: str | None = None, limit: int = 500
) -> tuple[list[str], int, bool]:
    """The answer texts of a job's results stored after result `after_id` (by workers other
    than `not_worker`), oldest first, at most the newest `limit`; the last result id seen
    and whether the job is done. What one worker's suffix index learns from the others'."""
    q = (
        select(Result.id, Result.body, Metric.worker_host)
        .join(Item, Item.id == Result.item_id)
        .join(Metric, Metric.item_id == Result.item_id, isouter=True)
        .where(Item.job_id == job_id, Result.id > after_id)
        .order_by(Result.id.desc())
        .limit(limit)
    )
    rows = session.execute(q).all()[::-1]
    last = max((r.id for r in rows), default=after_id)
    texts = []
    for r in rows:
        if not_worker is not None and r.worker_host == not_worker:
            continue
        for choice in (r.body or {}).get("choices", []):
            text = (
                choice.get("text") if "text" in choice else choice.get("message", {}).get("content")
            )
            if text:
                texts.append(text)
    status = session.execute(select(Job.status).where(Job.id == job_id)).scalar_one_or_none()
    return texts, last, status is None or status in JOB_DONE


def open_item_ids(
    session: Session, job_id: str, statuses: Iterable[str] = ("pending",)
) -> list[int]:
    return list(
        session.scalars(
            select(Item.id)
            .where(Item.job_id == job_id, Item.status.in_(tuple(statuses)))
            .order_by(Item.line)
        )
    )


def cancel_job(session: Session, job_id: str) -> Job:
    """Stop a job: pending items are cancelled now; running ones are dropped by their
    worker at its next heartbeat (one that finishes first keeps its result), then
    `cancelled`.

    A running item whose lease has expired (its worker died) is cancelled now too, so the job
    always ends `cancelled`; one whose worker dies later is cancelled by the sweeper.
    """
    job = get_job(session, job_id)
    if job.status in JOB_DONE:
        return job
    now = utcnow()
    # Items before the job row: the order workers lock them in (no deadlock on PostgreSQL).
    session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.status == "pending")
        .values(
            status="cancelled",
            error_code="cancelled",
            error_message="cancelled before it ran",
            finished_at=now,
            lease_owner=None,
            lease_expires_at=None,
        )
    )
    session.execute(
        update(Item)
        .where(
            Item.job_id == job_id,
            Item.status == "running",
            Item.lease_owner.is_not(None),
            Item.lease_expires_at < now,
        )
        .values(**_cancelled_orphan(now))
    )
    job.status, job.cancelling_at = "cancelling", now
    refresh_job(session, job_id)
    session.commit()
    return job


# Item statuses a retry (or a resumed `applespec run`) runs again: bad input lines stay.
RETRIABLE = ("failed", "cancelled")
INTERRUPTED = "interrupted"  # the error code of an item whose `applespec run` process died


def retry_job(session: Session, job_id: str) -> list[int]:
    """Queue a job's failed and cancelled (not invalid) items again with fresh attempts, and
    its pending or running items whose lease expired (their worker died); their ids. Commits.

    A cancelled or cancelling job is resumed: it is `in_progress` again, and its running
    items (a cancel lets them finish) are kept.
    """
    job = get_job(session, job_id)
    again = open_item_ids(session, job_id, RETRIABLE)
    stuck = [i for _, i in expired_items(session, job_id=job_id)]
    if not again and not stuck:
        return []
    if again:
        session.execute(
            update(Item)
            .where(Item.job_id == job_id, Item.status.in_(RETRIABLE))
            .values(
                status="pending", attempts=0, error_code=None, error_message=None, finished_at=None
            )
        )
    for i in range(0, len(stuck), 500):
        session.execute(
            update(Item)
            .where(Item.id.in_(stuck[i : i + 500]), Item.status.in_(("pending", "running")))
            .values(status="pending", lease_owner=None, lease_expires_at=None),
            execution_options={"synchronize_session": False},
        )
    job.status = "in_progress"
    for stamp in ("completed_at", "failed_at", "finalizing_at", "cancelled_at", "cancelling_at"):
        setattr(job, stamp, None)
    refresh_job(session, job_id)
    session.commit()
    return sorted(again + stuck)


def interrupt_dead_runs(session: Session, owner_dead: OwnerDead) -> list[str]:
    """Close the open items of `applespec run` jobs whose process died; the jobs' ids. Commits.

    An embedded run has no lease and no sweeper: its items record the process running them
    (`host:pid`, Item.worker). When `owner_dead` says that process is gone, its running and
    pending items become `cancelled` with the error code `interrupted`, and the job ends
    `cancelled`, resumable by running the same command again (not `in_progress` forever).
    """
    rows = session.execute(
        select(Item.job_id, Item.worker)
        .join(Job, Job.id == Item.job_id)
        .where(
            Job.mode == "embedded",
            Job.status.in_(("validating", "in_progress")),
            Item.status == "running",
            Item.worker.is_not(None),
        )
        .distinct()
    ).all()
    dead_jobs: dict[str, str] = {}
    for job_id, owner in rows:
        if owner_dead(owner):
            dead_jobs.setdefault(job_id, owner)
    if not dead_jobs:
        session.rollback()
        return []
    for job_id, owner in dead_jobs.items():
        for item in session.scalars(
            select(Item)
            .where(Item.job_id == job_id, Item.status.in_(("pending", "running")))
            .with_for_update()
        ):
            _close(
                item,
                "cancelled",
                INTERRUPTED,
                f"line {item.line}: interrupted: the `applespec run` process running it "
                f"({owner}) stopped; run the same command again to resume",
            )
        session.flush()
        refresh_job(session, job_id)
    session.commit()
    return sorted(dead_jobs)


def find_resumable_run(session: Session, submission_hash: str) -> Job | None:
    """The newest `applespec run` job of this submission that did not finish every request:
    cancelled, interrupted, or with failed requests (None: start a new job)."""
    job = session.scalar(
        select(Job)
        .where(Job.mode == "embedded", Job.submission_hash == submission_hash)
        .order_by(Job.created_at.desc())
        .limit(1)
    )
    if job is None:
        return None
    left = session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.job_id == job.id, Item.status.in_(("pending", "running", *RETRIABLE)))
    )
    return job if left else None


def reopen_run(session: Session, job_id: str) -> list[int]:
    """Make a resumed `applespec run` job's unfinished items pending again (attempts reset);
    the ids of every pending item. Commits."""
    job = get_job(session, job_id)
    session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.status.in_(("running", *RETRIABLE)))
        .values(
            status="pending",
            attempts=0,
            error_code=None,
            error_message=None,
            finished_at=None,
            worker=None,
        )
    )
    job.status, job.in_progress_at = "in_progress", job.in_progress_at or utcnow()
    for stamp in ("completed_at", "failed_at", "finalizing_at", "cancelled_at", "cancelling_at"):
        setattr(job, stamp, None)
    refresh_job(session, job_id)
    session.commit()
    return open_item_ids(session, job_id)


def resumable(session: Session, job: Job) -> int:
    """How many of a finished job's requests a retry would run again (failed or cancelled,
    not invalid); 0 for a job still running."""
    if job.status not in JOB_DONE:
        return 0
    return session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.job_id == job.id, Item.status.in_(RETRIABLE))
    )


def find_job(session: Session, idempotency_key: str) -> Job | None:
    """The job submitted under `idempotency_key`, if any."""
    return session.scalar(select(Job).where(Job.idempotency_key == idempotency_key))


def worker_seen(session: Session, name: str, queues: Iterable[str], ttl_s: float) -> None:
    """Record that worker `name` (host:pid) consumes `queues`, for `ttl_s` seconds; commits."""
    now = utcnow()
    row = {
        "name": name,
        "queues": ",".join(queues),
        "seen_at": now,
        "expires_at": lease_until(ttl_s),
    }
    dialect = session.get_bind().dialect.name
    insert_ = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert_(WorkerPresence).values(started_at=now, **row)
    stmt = stmt.on_conflict_do_update(
        index_elements=["name"],
        set_={k: stmt.excluded[k] for k in ("queues", "seen_at", "expires_at")},
    )
    session.execute(stmt)
    session.commit()


def worker_gone(session: Session, name: str) -> None:
    """A worker stopped cleanly: it no longer counts as consuming its queues; commits."""
    session.execute(
        update(WorkerPresence).where(WorkerPresence.name == name).values(expires_at=utcnow())
    )
    session.commit()


def queue_consumers(session: Session, queue: str) -> tuple[int, datetime | None]:
    """How many live workers consume `queue`, and when one was last seen (None: never)."""
    now = utcnow()
    live, last = 0, None
    for queues, seen, expires in session.execute(
        select(WorkerPresence.queues, WorkerPresence.seen_at, WorkerPresence.expires_at)
    ):
        if queue in queues.split(","):
            live += aware(expires) > now
            last = max(last, aware(seen)) if last else aware(seen)
    return live, last


def job_summary(session: Session, job_id: str) -> dict[str, Any]:
    """Status, request counts, and acceptance and throughput over the items done so far."""
    job = get_job(session, job_id)
    m = session.execute(
        select(
            func.count(Metric.id),
            func.sum(Metric.completion_tokens),
            func.sum(Metric.total_s),
            func.sum(Metric.accepted_tokens),
            func.sum(Metric.draft_tokens),
            func.sum(Metric.verify_steps),
            # structured output (items with a response_format): tokens its grammar forced,
            # seconds spent in its masks; kept in the engine's dicts (NULL elsewhere)
            func.sum(Metric.speculative["forced_tokens"].as_integer()),
            func.sum(Metric.timing["mask_s"].as_float()),
        )
        .join(Item, Item.id == Metric.item_id)
        .where(Item.job_id == job_id)
    ).one()
    n, tokens, engine_s, accepted, drafted, steps = (v or 0 for v in m[:6])
    forced, mask_s = m[6:]
    start = aware(job.in_progress_at or job.created_at)
    end = aware(job.completed_at or job.failed_at or job.cancelled_at) or utcnow()
    wall = max((end - start).total_seconds(), 0.0)
    open_items = session.scalar(
        select(func.count())
        .select_from(Item)
        .where(Item.job_id == job_id, Item.status.in_(("pending", "running")))
    )
    return {
        "id": job.id,
        "status": job.status,
        "model": job.model,
        "drafter": job.drafter,
        "mode": job.mode,
        "input_file": job.input_file,
        "created_at": aware(job.created_at).isoformat(),
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        # Requests a retry runs again (`applespec retry`, or the same `applespec run`).
        "resumable": resumable(session, job),
        "eta": eta(job.status, open_items, n, tokens, wall),
        "energy": job_energy(session, job_id),
        "metrics": {
            "items_measured": n,
            "completion_tokens": tokens,
            "engine_s": engine_s,
            "wall_s": wall,
            "tokens_per_s": tokens / wall if wall > 0 else None,
            "engine_tokens_per_s": tokens / engine_s if engine_s > 0 else None,
            "acceptance_rate": accepted / drafted if drafted else None,
            # Tokens per target verify step (accepted drafts + the bonus/corrected token).
            "mean_accepted_length": tokens / steps if steps else None,
            "forced_tokens": forced,  # None: no item asked for a response_format
            "mask_s": mask_s,
            "acceptance_over_time": acceptance_over_time(session, job_id),
            "adapter_version": _latest_adapter_version(session, job_id),
        },
    }


def eta(status: str, open_items: int, measured: int, tokens: int, wall_s: float) -> dict:
    """When a job should finish, from its own measurements: the requests left times the mean
    completion tokens of those done, at the job's measured rate (tokens over wall time).

    `seconds` is None ("not yet known") until a request has finished, and once the job is
    done; `remaining_tokens` is the estimate it is computed from.
    """
    if status in JOB_DONE or not measured or not tokens or wall_s <= 0:
        return {"seconds": None, "remaining_tokens": None, "open_requests": open_items}
    remaining = open_items * tokens / measured
    return {
        "seconds": remaining / (tokens / wall_s),
        "remaining_tokens": round(remaining),
        "open_requests": open_items,
    }


def per_1k(joules: float | None, tokens: int) -> float | None:
    return joules * 1000 / tokens if joules is not None and tokens else None


def job_energy(session: Session, job_id: str) -> dict[str, Any]:
    """A job's measured energy: joules, joules per 1k completion tokens (over the requests
    measured), and the same per worker host. None where nothing was measured."""
    rows = session.execute(
        select(
            Metric.worker_host,
            func.count(Metric.energy_j),
            func.sum(Metric.energy_j),
            func.sum(case((Metric.energy_j.is_not(None), Metric.completion_tokens), else_=0)),
            func.max(Metric.energy_source),
        )
        .join(Item, Item.id == Metric.item_id)
        .where(Item.job_id == job_id)
        .group_by(Metric.worker_host)
    ).all()
    hosts = {
        host: {"joules": j, "joules_per_1k_tokens": per_1k(j, tokens or 0), "source": src}
        for host, measured, j, tokens, src in rows
        if measured
    }
    measured = sum(r[1] for r in rows)
    joules = sum(r[2] or 0.0 for r in rows) if measured else None
    tokens = sum(r[3] or 0 for r in rows)
    return {
        "joules": joules,
        "joules_per_1k_tokens": per_1k(joules, tokens),
        "measured_requests": measured,
        "sources": sorted({h["source"] for h in hosts.values() if h["source"]}),
        "hosts": hosts,
    }


def duration(seconds: float | None) -> str:
    """`1h02m`, `3m05s`, `12s` (`–` for None): a duration as people read one."""
    if seconds is None:
        return "–"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def acceptance_over_time(session: Session, job_id: str, points: int = 10) -> list[dict]:
    """The job's acceptance as its items finished: the items measured so far in finish
    order, cut into up to `points` consecutive groups; per group the items finished by its
    end and the share of drafted tokens accepted in it (None where nothing was drafted)."""
    rows = session.execute(
        select(Metric.accepted_tokens, Metric.draft_tokens)
        .join(Item, Item.id == Metric.item_id)
        .where(Item.job_id == job_id)
        .order_by(Metric.id)
    ).all()
    out, n = [], len(rows)
    groups = min(points, n)
    for g in range(groups):
        lo, hi = g * n // groups, (g + 1) * n // groups
        accepted = sum(a or 0 for a, _ in rows[lo:hi])
        drafted = sum(d or 0 for _, d in rows[lo:hi])
        out.append({"items": hi, "acceptance_rate": accepted / drafted if drafted else None})
    return out


def _latest_adapter_version(session: Session, job_id: str) -> int | None:
    """The online-learned self-drafter version the job's latest item finished with."""
    spec = session.scalar(
        select(Metric.speculative)
        .join(Item, Item.id == Metric.item_id)
        .where(Item.job_id == job_id)
        .order_by(Metric.id.desc())
        .limit(1)
    )
    return (spec or {}).get("adapter_version")


def output_lines(session: Session, job_id: str) -> Iterator[tuple[bool, dict[str, Any]]]:
    """The job's OpenAI Batch output lines in input order, as (ok, line).

    Items still pending or running are left out; failed, cancelled and invalid items are errors.
    """
    get_job(session, job_id)
    rows = session.execute(
        select(Item, Result)
        .outerjoin(Result, Result.item_id == Item.id)
        .where(Item.job_id == job_id)
        .order_by(Item.line)
        # Batches of rows (a server-side cursor on PostgreSQL): a job's output is never whole
        # in memory.
        .execution_options(yield_per=500)
    )
    for item, result in rows:
        if result is not None:
            yield True, output_line(job_id, item.line, item.custom_id, body=result.body)
        elif item.status in ITEM_DONE:
            error = {"code": item.error_code or item.status, "message": item.error_message or ""}
            yield False, output_line(job_id, item.line, item.custom_id, error=error)


def stored_results(session: Session, job_id: str) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line, custom_id, response body) of each of the job's stored results, in line order."""
    rows = session.execute(
        select(Item.line, Item.custom_id, Result.body)
        .join(Result, Result.item_id == Item.id)
        .where(Item.job_id == job_id)
        .order_by(Item.line)
        .execution_options(yield_per=500)
    )
    yield from ((line, cid, body) for line, cid, body in rows)


def invalid_lines(session: Session, job_id: str) -> list[LineError]:
    """The job's bad input lines as stored, in line order."""
    rows = session.execute(
        select(Item.line, Item.custom_id, Item.error_code, Item.error_message)
        .where(Item.job_id == job_id, Item.status == "invalid")
        .order_by(Item.line)
    )
    return [LineError(line, cid, code or "invalid", msg or "") for line, cid, code, msg in rows]


def list_jobs(session: Session, limit: int = 50) -> list[Job]:
    return list(session.scalars(select(Job).order_by(Job.created_at.desc()).limit(limit)))


def metric_row(
    result: Any,
    *,
    attempt: int,
    worker_host: str,
    queue_wait_s: float | None,
    energy_j: float | None = None,
    energy_source: str | None = None,
) -> dict[str, Any]:
    """A metrics row for an engine GenerationResult (its speculative and timing dicts) and
    the energy measured for it (core.energy; None: not measured)."""
    spec, timing = dict(result.speculative), dict(result.timing)
    return {
        "energy_j": energy_j,
        "energy_source": energy_source if energy_j is not None else None,
        "attempt": attempt,
        "worker_host": worker_host,
        "queue_wait_s": queue_wait_s,
        "completion_tokens": len(result.tokens),
        **{k: spec.get(k) for k in _SPEC_FIELDS},
        **{k: timing.get(k) for k in _TIMING_FIELDS},
        "speculative": spec,
        "timing": timing,
    }


_SPEC_FIELDS = (
    "drafter",
    "draft_tokens",
    "accepted_tokens",
    "verify_steps",
    "acceptance_rate",
    "mean_accepted_length",
)
_TIMING_FIELDS = (
    "ttft_s",
    "decode_tokens_per_s",
    "draft_s",
    "verify_s",
    "accept_s",
    "cache_s",
    "total_s",
    "peak_memory_bytes",
)
