"""The SQL schema: jobs, their items (one per input line), results, per-item metrics, and
the workers that consume the queues (their presence, for `wait`)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Stable constraint names, so Alembic migrations (and SQLite batch mode) can refer to them.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# OpenAI Batch job statuses.
JOB_STATUSES = (
    "validating",
    "in_progress",
    "finalizing",
    "completed",
    "failed",
    "cancelling",
    "cancelled",
)
JOB_DONE = ("completed", "failed", "cancelled")
# Item statuses: "invalid" = a bad input line (never runs), the rest are a valid request's life.
ITEM_STATUSES = ("pending", "running", "completed", "failed", "cancelled", "invalid")
ITEM_DONE = ("completed", "failed", "cancelled", "invalid")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class Job(Base):
    """A batch: one input file run on one model with one drafter."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(String(255))
    drafter: Mapped[str] = mapped_column(String(255), default="auto")
    k: Mapped[int | None] = mapped_column(Integer)
    # CLI overrides (max_tokens, temperature, top_p, seed); None values are not overrides.
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    mode: Mapped[str] = mapped_column(String(16), default="service")  # "service" | "embedded"
    status: Mapped[str] = mapped_column(String(16), default="validating")
    input_file: Mapped[str | None] = mapped_column(String(1024))
    queue: Mapped[str | None] = mapped_column(String(255))
    # Which broker incarnation holds this job's queued chunks (see worker/sweeper.py).
    broker_epoch: Mapped[str | None] = mapped_column(String(64))
    # `submit --idempotency-key`: a repeated key returns this job (unique; NULLs repeat).
    idempotency_key: Mapped[str | None] = mapped_column(String(255), unique=True)
    # sha256 of what was submitted under the key, so a different submission is refused.
    submission_hash: Mapped[str | None] = mapped_column(String(64))
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    in_progress_at: Mapped[datetime | None]
    finalizing_at: Mapped[datetime | None]
    completed_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    cancelling_at: Mapped[datetime | None]
    cancelled_at: Mapped[datetime | None]

    items: Mapped[list[Item]] = relationship(back_populates="job", order_by="Item.line")


class Item(Base):
    """One input line. Valid lines carry their normalized request; bad lines their error."""

    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("job_id", "line"),
        # custom_id is unique among a job's requests; bad lines may repeat or lack it.
        Index(
            "uq_items_job_id_custom_id",
            "job_id",
            "custom_id",
            unique=True,
            sqlite_where=text("status != 'invalid'"),
            postgresql_where=text("status != 'invalid'"),
        ),
        Index("ix_items_job_id_status", "job_id", "status"),
        Index("ix_items_status_lease_expires_at", "status", "lease_expires_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    line: Mapped[int] = mapped_column(Integer)
    custom_id: Mapped[str | None] = mapped_column(String(512))
    # core.jobs.JobRequest.to_dict() for valid lines; None for bad lines.
    request: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))  # host:pid of the latest start
    # The lease: which process (host:pid) holds the item and until when. A pending item may be
    # leased too (its chunk is reserved); an expired lease means its worker stopped beating.
    lease_owner: Mapped[str | None] = mapped_column(String(255))
    lease_expires_at: Mapped[datetime | None]
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    queued_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]

    job: Mapped[Job] = relationship(back_populates="items")
    result: Mapped[Result | None] = relationship(back_populates="item")
    metric: Mapped[Metric | None] = relationship(back_populates="item")


class Result(Base):
    """The response of one item; the unique item_id makes a redelivered write a no-op."""

    __tablename__ = "results"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), unique=True)
    body: Mapped[dict[str, Any]]  # the chat.completion object
    finish_reason: Mapped[str] = mapped_column(String(16))
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    total_tokens: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    item: Mapped[Item] = relationship(back_populates="result")


class Metric(Base):
    """What the engine reported for an item, plus where and when it ran."""

    __tablename__ = "metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"), unique=True)
    attempt: Mapped[int] = mapped_column(Integer)
    worker_host: Mapped[str] = mapped_column(String(255))
    queue_wait_s: Mapped[float | None] = mapped_column(Float)
    drafter: Mapped[str | None] = mapped_column(String(255))
    draft_tokens: Mapped[int | None] = mapped_column(Integer)
    accepted_tokens: Mapped[int | None] = mapped_column(Integer)
    verify_steps: Mapped[int | None] = mapped_column(Integer)
    acceptance_rate: Mapped[float | None] = mapped_column(Float)
    mean_accepted_length: Mapped[float | None] = mapped_column(Float)
    completion_tokens: Mapped[int] = mapped_column(Integer)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    decode_tokens_per_s: Mapped[float | None] = mapped_column(Float)
    draft_s: Mapped[float | None] = mapped_column(Float)
    verify_s: Mapped[float | None] = mapped_column(Float)
    accept_s: Mapped[float | None] = mapped_column(Float)
    cache_s: Mapped[float | None] = mapped_column(Float)
    total_s: Mapped[float | None] = mapped_column(Float)
    peak_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    # Joules its process's device used while it ran (core.energy); None: not measured.
    energy_j: Mapped[float | None] = mapped_column(Float)
    energy_source: Mapped[str | None] = mapped_column(String(16))  # "nvml" | "rapl"
    # The engine's full dicts, so fields added later are kept too.
    speculative: Mapped[dict[str, Any]] = mapped_column(default=dict)
    timing: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    item: Mapped[Item] = relationship(back_populates="metric")


class WorkerPresence(Base):
    """A worker (its main process) and the queues it consumes, refreshed every sweep."""

    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)  # host:pid
    queues: Mapped[str] = mapped_column(Text)  # comma-separated
    started_at: Mapped[datetime] = mapped_column(default=utcnow)
    seen_at: Mapped[datetime] = mapped_column(default=utcnow)
    # Past this the worker counts as gone (a few sweep intervals after it was last seen).
    expires_at: Mapped[datetime]
