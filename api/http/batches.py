"""`/v1/batches`: create a batch from an uploaded file, read, list and cancel batches.

A batch is submitted exactly as `applespec submit` submits a job file (api.client.
submit_lines: core.jobs validation, the same per-line errors, the same queues), with the
batch row stored in the job's own transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel
from sqlalchemy import func, select

from core.jobs import CHAT_URL, LongLine
from core.settings import Settings
from core.store import batches, files, repo
from core.store.models import JOB_DONE, Item, Result
from core.store.pagination import UnknownCursor

from .auth import owner
from .errors import OpenAIError, not_found
from .files import unix

router = APIRouter(prefix="/v1")

ENDPOINTS = (CHAT_URL,)
COMPLETION_WINDOWS = ("24h",)
# OpenAI's metadata limits.
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512


class BatchCreate(BaseModel):
    """The body of `POST /v1/batches` (other fields OpenAI defines are ignored)."""

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None = None


def batch_object(s, batch: batches.Batch) -> dict[str, Any]:
    """OpenAI's Batch object for a stored batch."""
    job = batch.job
    prompt, completion = s.execute(
        select(
            func.coalesce(func.sum(Result.prompt_tokens), 0),
            func.coalesce(func.sum(Result.completion_tokens), 0),
        )
        .join(Item, Item.id == Result.item_id)
        .where(Item.job_id == job.id)
    ).one()
    return {
        "id": batch.id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "model": job.model,
        "errors": None,
        "input_file_id": batch.input_file_id,
        "completion_window": batch.completion_window,
        "status": job.status,
        "output_file_id": batch.output_file_id,
        "error_file_id": batch.error_file_id,
        "created_at": unix(batch.created_at),
        "in_progress_at": unix(job.in_progress_at),
        "expires_at": None,  # batches here do not expire
        "finalizing_at": unix(job.finalizing_at),
        "completed_at": unix(job.completed_at),
        "failed_at": unix(job.failed_at),
        "expired_at": None,
        "cancelling_at": unix(job.cancelling_at),
        "cancelled_at": unix(job.cancelled_at),
        "request_counts": {"total": job.total, "completed": job.completed, "failed": job.failed},
        "usage": {
            "input_tokens": int(prompt),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": int(completion),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": int(prompt + completion),
        },
        "metadata": batch.meta,
    }


def _check_metadata(metadata: dict[str, Any] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if len(metadata) > METADATA_PAIRS:
        raise OpenAIError(
            400, f"metadata has {len(metadata)} keys; at most {METADATA_PAIRS}", param="metadata"
        )
    for k, v in metadata.items():
        if len(k) > METADATA_KEY_CHARS:
            raise OpenAIError(
                400,
                f"metadata key {k[:20]!r}... is over {METADATA_KEY_CHARS} characters",
                param="metadata",
            )
        if not isinstance(v, str) or len(v) > METADATA_VALUE_CHARS:
            raise OpenAIError(
                400,
                f"metadata[{k!r}] must be a string of at most {METADATA_VALUE_CHARS} characters",
                param="metadata",
            )
    return metadata


def batch_model(lines: Iterable[bytes | LongLine], settings: Settings) -> str:
    """The model a batch runs on: the one served model its lines name, else the default.

    A line's body.model that the farm does not serve (say "gpt-4o-mini" from a pipeline
    written for OpenAI) runs on the default model, `APPLESPEC_MODEL`.
    """
    served = (settings.model, *settings.serve_models)
    named = set()
    for raw in lines:
        if isinstance(raw, LongLine):
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):  # not UTF-8, not JSON, nested too deep
            continue  # the line's own error comes from validation (core.jobs.parse_job)
        body = obj.get("body") if isinstance(obj, dict) else None
        model = body.get("model") if isinstance(body, dict) else None
        if model is None and isinstance(obj, dict):
            model = obj.get("model")
        if model in served:
            named.add(model)
    if len(named) > 1:
        raise OpenAIError(
            400,
            f"the file's lines name several served models ({', '.join(sorted(named))}); "
            "a batch runs on one model",
            param="input_file_id",
            code="multiple_models",
        )
    return named.pop() if named else settings.model


@router.post("/batches")
def create_batch(
    request: Request, body: BatchCreate, key_id: str | None = Depends(owner)
) -> dict[str, Any]:
    from api.client import BrokerUnavailable, submit_lines
    from core.models import ModelError

    state = request.app.state
    if body.endpoint not in ENDPOINTS:
        raise OpenAIError(
            400,
            f"endpoint {body.endpoint!r} is not supported; this server runs {', '.join(ENDPOINTS)}",
            param="endpoint",
            code="unsupported_endpoint",
        )
    if body.completion_window not in COMPLETION_WINDOWS:
        raise OpenAIError(
            400,
            f"completion_window must be one of {', '.join(COMPLETION_WINDOWS)}, "
            f"got {body.completion_window!r}",
            param="completion_window",
        )
    metadata = _check_metadata(body.metadata)
    with state.reader() as s:
        try:
            f = files.get_file(s, body.input_file_id, key_id)
        except files.UnknownFile as e:
            raise not_found(str(e), param="input_file_id") from e
        if f.purpose != files.INPUT_PURPOSE:
            raise OpenAIError(
                400,
                f"{f.id} has purpose {f.purpose!r}; a batch needs a file uploaded with "
                f"purpose={files.INPUT_PURPOSE!r}",
                param="input_file_id",
            )
        settings = state.settings
        limits = settings.job_limits()
        model = batch_model(files.upload_lines(s, f, limits), settings)
        lines = files.upload_lines(s, f, limits)
    made: list[str] = []

    def attach(session, job) -> None:
        batches.add_batch(
            session,
            job,
            key_id=key_id,
            input_file_id=f.id,
            endpoint=body.endpoint,
            completion_window=body.completion_window,
            metadata=metadata,
        )
        made.append(job.id)

    try:
        submit_lines(
            settings,
            lines,
            model=model,
            input_file=f.id,
            sessions=state.sessions,
            on_create=attach,
        )
    except ModelError as e:
        raise OpenAIError(503, f"model {model!r} cannot be loaded: {e}", type="server_error") from e
    except BrokerUnavailable as e:
        # Stored before the broker failed: a worker's sweep queues it once the broker is back.
        if not made:
            raise OpenAIError(503, str(e), type="server_error", code="broker_unavailable") from e
    with state.reader() as s:
        return batch_object(s, batches.get_batch(s, made[0], key_id))


def _batch(request: Request, batch_id: str, key_id: str | None) -> dict[str, Any]:
    """A batch's object; a finished batch gets its output and error files first."""
    state = request.app.state
    with state.reader() as s:
        try:
            batch = batches.get_batch(s, batch_id, key_id)
        except batches.UnknownBatch as e:
            raise not_found(str(e), param="batch_id") from e
        if batch.outputs_made or batch.job.status not in JOB_DONE:
            return batch_object(s, batch)
    with state.sessions() as s:
        batch = batches.make_outputs(s, batches.get_batch(s, batch_id, key_id))
        return batch_object(s, batch)


@router.get("/batches/{batch_id}")
def retrieve_batch(
    request: Request, batch_id: str, key_id: str | None = Depends(owner)
) -> dict[str, Any]:
    return _batch(request, batch_id, key_id)


@router.get("/batches")
def list_batches(
    request: Request,
    key_id: str | None = Depends(owner),
    limit: int = Query(20, ge=1, le=100),
    after: str | None = None,
) -> dict[str, Any]:
    with request.app.state.reader() as s:
        try:
            rows, more = batches.list_batches(s, key_id, limit=limit, after=after)
        except UnknownCursor as e:
            raise OpenAIError(400, str(e), param="after") from e
        ids = [b.id for b in rows]
    data = [_batch(request, batch_id, key_id) for batch_id in ids]
    return {
        "object": "list",
        "data": data,
        "first_id": ids[0] if ids else None,
        "last_id": ids[-1] if ids else None,
        "has_more": more,
    }


@router.post("/batches/{batch_id}/cancel")
def cancel_batch(
    request: Request, batch_id: str, key_id: str | None = Depends(owner)
) -> dict[str, Any]:
    """Cancel: queued requests are dropped now, running ones at their worker's next
    heartbeat (a row that finishes first keeps its result), then `cancelled`."""
    with request.app.state.sessions() as s:
        try:
            batch = batches.get_batch(s, batch_id, key_id)
        except batches.UnknownBatch as e:
            raise not_found(str(e), param="batch_id") from e
        status = batch.job.status
        if status in ("completed", "failed"):
            raise OpenAIError(
                400, f"cannot cancel {batch_id}: it is already {status}", code="batch_done"
            )
        repo.cancel_job(s, batch_id)
    return _batch(request, batch_id, key_id)


# AppleSpec's own routes beside OpenAI's (the OpenAI client ignores them; api.remote uses them).


@router.get("/batches/{batch_id}/status")
def batch_status(
    request: Request, batch_id: str, key_id: str | None = Depends(owner)
) -> dict[str, Any]:
    """The batch's job as `applespec status --json` shows it: counts, ETA, energy, metrics."""
    with request.app.state.reader() as s:
        try:
            batches.get_batch(s, batch_id, key_id)
        except batches.UnknownBatch as e:
            raise not_found(str(e), param="batch_id") from e
        return repo.job_summary(s, batch_id)


@router.post("/batches/{batch_id}/retry")
def retry_batch(
    request: Request, batch_id: str, key_id: str | None = Depends(owner)
) -> dict[str, Any]:
    """Resume a batch: its failed and cancelled requests queued again (`applespec retry`)."""
    from api.client import BrokerUnavailable, requeue

    state = request.app.state
    with state.reader() as s:
        try:
            batches.get_batch(s, batch_id, key_id)
        except batches.UnknownBatch as e:
            raise not_found(str(e), param="batch_id") from e
    try:
        queued = requeue(state.settings, state.sessions, batch_id)
    except BrokerUnavailable as e:
        raise OpenAIError(503, str(e), type="server_error", code="broker_unavailable") from e
    return {**_batch(request, batch_id, key_id), "requeued": queued}
