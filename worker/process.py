"""Run one stored item through an engine and store its result: the step `run` and workers share."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from core.draft_policy import DraftNotAllowed
from core.jobs import JobRequest, completion_body
from core.store import repo
from core.store.models import Item

from .owner import owner_is_dead, worker_name  # noqa: F401 - their home before worker.owner


@dataclass
class Outcome:
    """What happened to an item that ran: its chat.completion body, or its error."""

    line: int
    custom_id: str | None
    body: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    result: Any = None  # the engine's GenerationResult when it succeeded


@dataclass
class Started:
    """A claimed item, ready for the engine."""

    item_id: int
    job_id: str
    line: int
    custom_id: str
    job_model: str
    drafter: str
    k: int | None
    request: JobRequest
    attempt: int
    queued_at: Any
    started_at: Any


def start_item(
    session: Session,
    item_id: int,
    *,
    max_attempts: int,
    worker_host: str,
    lease_s: float | None = None,
    owner_dead: Callable[[str], bool] | None = None,
) -> Started | None:
    """Claim an item (attempts counted, lease taken); None when it is done, cancelled,
    capped or leased by another live worker."""
    item = repo.claim_item(session, item_id, worker_host, lease_s, max_attempts, owner_dead)
    if item is None:
        return None
    job = item.job
    return Started(
        item_id=item.id,
        job_id=item.job_id,
        line=item.line,
        custom_id=item.custom_id,
        job_model=job.model,
        drafter=job.drafter,
        k=job.k,
        request=JobRequest.from_dict(item.request),
        attempt=item.attempts,
        queued_at=repo.aware(item.queued_at),
        started_at=repo.aware(item.started_at),
    )


def error_of(started: Started, e: BaseException) -> dict[str, str]:
    """The per-item error record of a failure while preparing or running it."""
    from core.engine.memory import RequestTooLarge  # here: importing worker code loads no MLX
    from core.models.model import ModelError

    code = (
        "model_error"
        if isinstance(e, ModelError)
        else "invalid_drafter"
        if isinstance(e, DraftNotAllowed)
        else "request_too_large"
        if isinstance(e, RequestTooLarge)
        else "engine_error"
    )
    return {"code": code, "message": f"line {started.line}: {type(e).__name__}: {e}"}


def store_result(
    session: Session,
    started: Started,
    result: Any,
    worker_host: str,
    energy: tuple[float | None, str | None] = (None, None),
) -> Outcome:
    """Store a finished item's response and metrics (once; a repeat is a no-op); `energy`
    is (joules, source) from core.energy.EnergyClock, (None, None) when not measured."""
    body = completion_body(started.job_model, result, request=started.request)
    wait = (
        (started.started_at - started.queued_at).total_seconds()
        if started.queued_at and started.started_at
        else None
    )
    metric = repo.metric_row(
        result,
        attempt=started.attempt,
        worker_host=worker_host,
        queue_wait_s=wait,
        energy_j=energy[0],
        energy_source=energy[1],
    )
    item = session.get(Item, started.item_id)
    repo.finish_item(session, item, body, metric)
    return Outcome(started.line, started.custom_id, body=body, result=result)


def store_error(session: Session, started: Started, e: BaseException) -> Outcome:
    error = error_of(started, e)
    repo.fail_item(session, started.item_id, **error)
    return Outcome(started.line, started.custom_id, error=error)
