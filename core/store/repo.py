"""What the CLI and the workers do to the store: jobs, item life cycle, derived job status."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from core.jobs import JobRequest, LineError, output_line

from .models import ITEM_DONE, JOB_DONE, Item, Job, Metric, Result, utcnow


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
) -> Job:
    """Store a job with one item per line: valid ones pending, bad ones `invalid` with their error.

    The job stays `validating` until the caller has enqueued it (`mark_in_progress`).
    """
    job = Job(
        id=job_id or new_job_id(),
        model=model,
        drafter=drafter,
        k=k,
        params={k_: v for k_, v in (params or {}).items() if v is not None},
        mode=mode,
        input_file=input_file,
        queue=queue,
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
            "error_message": e.message,
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


def start_item(
    session: Session, item_id: int, max_attempts: int, worker: str | None = None
) -> Item | None:
    """Claim an item for a run: None when it is done, cancelled, or out of attempts.

    Attempts are counted here, before the engine runs, so an item that kills its worker is
    seen on redelivery; after `max_attempts` starts it is marked failed. Commits.
    """
    item = session.execute(select(Item).where(Item.id == item_id).with_for_update()).scalar_one()
    if item.status in ITEM_DONE:
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
        session.commit()  # a start changes no count: no job recount here
        return item
    session.flush()
    refresh_job(session, item.job_id)
    session.commit()
    return None


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
        .values(status="completed", finished_at=utcnow(), error_code=None, error_message=None)
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


def _close(item: Item, status: str, code: str, message: str) -> None:
    item.status = status
    item.error_code = code
    item.error_message = message
    item.finished_at = utcnow()


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
    """Stop a job: pending items are cancelled now, running ones finish, then `cancelled`."""
    job = get_job(session, job_id)
    if job.status in JOB_DONE:
        return job
    # Items before the job row: the order workers lock them in (no deadlock on PostgreSQL).
    session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.status == "pending")
        .values(
            status="cancelled",
            error_code="cancelled",
            error_message="cancelled before it ran",
            finished_at=utcnow(),
        )
    )
    job.status, job.cancelling_at = "cancelling", utcnow()
    refresh_job(session, job_id)
    session.commit()
    return job


def retry_job(session: Session, job_id: str) -> list[int]:
    """Reset a job's failed (not invalid) items to pending with fresh attempts; their ids."""
    job = get_job(session, job_id)
    ids = open_item_ids(session, job_id, ("failed",))
    if not ids:
        return []
    session.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.status == "failed")
        .values(status="pending", attempts=0, error_code=None, error_message=None, finished_at=None)
    )
    job.status = "in_progress"
    for stamp in ("completed_at", "failed_at", "finalizing_at"):
        setattr(job, stamp, None)
    refresh_job(session, job_id)
    session.commit()
    return ids


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
        )
        .join(Item, Item.id == Metric.item_id)
        .where(Item.job_id == job_id)
    ).one()
    n, tokens, engine_s, accepted, drafted, steps = (v or 0 for v in m)
    start = aware(job.in_progress_at or job.created_at)
    end = aware(job.completed_at or job.failed_at or job.cancelled_at) or utcnow()
    wall = max((end - start).total_seconds(), 0.0)
    return {
        "id": job.id,
        "status": job.status,
        "model": job.model,
        "drafter": job.drafter,
        "mode": job.mode,
        "input_file": job.input_file,
        "created_at": aware(job.created_at).isoformat(),
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
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
        },
    }


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


def list_jobs(session: Session, limit: int = 50) -> list[Job]:
    return list(session.scalars(select(Job).order_by(Job.created_at.desc()).limit(limit)))


def metric_row(
    result: Any, *, attempt: int, worker_host: str, queue_wait_s: float | None
) -> dict[str, Any]:
    """A metrics row for an engine GenerationResult (its speculative and timing dicts)."""
    spec, timing = dict(result.speculative), dict(result.timing)
    return {
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
