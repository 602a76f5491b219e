"""Batches of the HTTP API: a job seen through the OpenAI Batch API, owned by one API key.

The job (core/store/models.py) is what the workers run; the batch row adds what the API
needs on top: the owner, the input file, the endpoint, the metadata and, once the job is
done, its output and error files. A batch's id is its job's id.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, ForeignKey, Index, String, delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column, relationship

from . import files
from .models import JOB_DONE, Base, Job, utcnow
from .pagination import newest_first


class UnknownBatch(LookupError):
    """No batch with this id that the caller may see."""


class Batch(Base):
    """The API's view of one job."""

    __tablename__ = "batches"
    __table_args__ = (Index("ix_batches_key_id_created_at", "key_id", "created_at"),)

    id: Mapped[str] = mapped_column(
        ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )  # = the job id
    key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"))
    input_file_id: Mapped[str] = mapped_column(String(64))
    endpoint: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    # `metadata` is taken on declarative classes; the column keeps the API's name.
    meta: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON(none_as_null=True))
    # Set once the job is done (make_outputs); None while running or when a file has no lines.
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    outputs_made: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(lazy="joined")


def add_batch(
    session: Session,
    job: Job,
    *,
    key_id: str | None,
    input_file_id: str,
    endpoint: str,
    completion_window: str,
    metadata: dict[str, str] | None,
) -> Batch:
    """Attach a batch to a job being created (same transaction as the job; flushes)."""
    batch = Batch(
        id=job.id,
        key_id=key_id,
        input_file_id=input_file_id,
        endpoint=endpoint,
        completion_window=completion_window,
        meta=metadata,
        created_at=job.created_at or utcnow(),
    )
    session.add(batch)
    session.flush()
    return batch


def get_batch(session: Session, batch_id: str, key_id: str | None) -> Batch:
    batch = session.scalars(
        select(Batch).where(Batch.id == batch_id, files.owned_by(Batch.key_id, key_id))
    ).first()
    if batch is None:
        raise UnknownBatch(f"No such Batch object: {batch_id}")
    return batch


def list_batches(
    session: Session, key_id: str | None, *, limit: int, after: str | None
) -> tuple[list[Batch], bool]:
    stmt = select(Batch).where(files.owned_by(Batch.key_id, key_id))
    return newest_first(session, stmt, Batch, limit=limit, after=after)


def make_outputs(session: Session, batch: Batch) -> Batch:
    """Give a finished batch its output and error files (once). Commits when it made them.

    A job that a retry reopens loses them (`reopen_outputs`) and gets new ones when it
    finishes again.
    """
    if batch.outputs_made or batch.job.status not in JOB_DONE:
        return batch
    batch_id, key_id = batch.id, batch.key_id
    try:
        ids = files.make_output_files(session, batch_id, key_id)
        batch.output_file_id, batch.error_file_id = ids["output"], ids["error"]
        batch.outputs_made = True
        session.commit()
    except IntegrityError:  # another request made them first
        session.rollback()
        batch = get_batch(session, batch_id, key_id)
    return batch


def reopen_outputs(session: Session, job_id: str) -> None:
    """A resumed job's batch (if it has one) forgets its output and error files, to make
    them again once the job finishes (their sizes and line counts change). Flushes."""
    batch = session.get(Batch, job_id)
    if batch is None or not batch.outputs_made:
        return
    session.execute(delete(files.File).where(files.File.job_id == job_id))
    batch.output_file_id = batch.error_file_id = None
    batch.outputs_made = False
    session.flush()
