"""Run one stored item through an engine and store its result: the step `run` and workers share."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from core.draft_policy import DraftNotAllowed
from core.engine.model import ModelError
from core.jobs import JobRequest, completion_body, run_request
from core.store import repo
from core.store.models import Job

# Test-only: a comma-separated list of custom_ids that make the worker process die
# (os._exit) when it starts them, to exercise the poison-item cap. Unset in production.
CRASH_ENV = "APPLESPEC_TEST_CRASH_ON"
# Test-only: seconds to wait before running each item, to make a chunk slower than the
# broker's visibility timeout or a shutdown land mid-chunk. Unset in production.
DELAY_ENV = "APPLESPEC_TEST_ITEM_DELAY"


def worker_name() -> str:
    """`host:pid` of this process: the owner of the leases it takes, recorded on the items it
    starts and in their metrics."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_is_dead(owner: str) -> bool:
    """Whether the lease owner `host:pid` surely no longer runs: a process of this host
    that does not exist (or is a zombie). Another host's process is never presumed dead;
    its lease runs out instead.

    A pool process killed outright has its chunk redelivered at once; this lets the next
    process take over its items without waiting for the lease to expire. Host names must
    be unique per process namespace (as Celery's node names assume).
    """
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    try:  # Linux: a zombie is dead, only not yet reaped
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


@dataclass
class Outcome:
    """What happened to an item that ran: its chat.completion body, or its error."""

    line: int
    custom_id: str | None
    body: dict[str, Any] | None = None
    error: dict[str, str] | None = None
    result: Any = None  # the engine's GenerationResult when it succeeded


def process_item(
    session: Session,
    item_id: int,
    *,
    engine_for: Callable[[Job], Any],
    max_attempts: int,
    worker_host: str | None = None,
    lease_s: float | None = None,
    owner_dead: Callable[[str], bool] | None = None,
) -> Outcome | None:
    """Claim, run and store one item; None when it was already done, cancelled, capped or
    leased by another live worker.

    With `lease_s` the item is leased to `worker_host` (its heartbeat must renew it). A
    failure of this one request (bad model, engine error) marks the item failed and returns
    its error; database errors propagate so the caller can retry the chunk.
    """
    worker_host = worker_host or worker_name()
    item = repo.claim_item(session, item_id, worker_host, lease_s, max_attempts, owner_dead)
    if item is None:
        return None
    job = item.job
    request = JobRequest.from_dict(item.request)
    started = repo.aware(item.started_at)
    queued = repo.aware(item.queued_at)
    _maybe_crash(request.custom_id)
    if os.environ.get(DELAY_ENV):
        time.sleep(float(os.environ[DELAY_ENV]))
    try:
        engine = engine_for(job)
        result = run_request(engine, request)
    except Exception as e:  # a bad item fails alone; the chunk goes on
        code = (
            "model_error"
            if isinstance(e, ModelError)
            else "invalid_drafter"
            if isinstance(e, DraftNotAllowed)
            else "engine_error"
        )
        error = {"code": code, "message": f"line {item.line}: {type(e).__name__}: {e}"}
        repo.fail_item(session, item.id, **error)
        return Outcome(item.line, item.custom_id, error=error)
    body = completion_body(job.model, result, request=request)
    metric = repo.metric_row(
        result,
        attempt=item.attempts,
        worker_host=worker_host,
        queue_wait_s=(started - queued).total_seconds() if queued and started else None,
    )
    repo.finish_item(session, item, body, metric)
    return Outcome(item.line, item.custom_id, body=body, result=result)


def _maybe_crash(custom_id: str) -> None:
    targets = os.environ.get(CRASH_ENV)
    if targets and custom_id in targets.split(","):
        os._exit(70)
