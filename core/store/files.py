"""Files of the HTTP API: uploaded batch inputs (kept in SQL) and batch outputs (streamed).

An upload is checked whole before anything is stored, then stored in one row. A batch's
output and error files hold no bytes of their own: their content is the job's output lines,
read from the result rows a slice at a time whenever it is downloaded.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
    func,
    select,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from core.jobs import parse_job

from . import repo
from .models import Base, utcnow
from .pagination import newest_first

INPUT_PURPOSE = "batch"
OUTPUT_PURPOSE = "batch_output"
READ_CHUNK = 1 << 20  # bytes of an upload read per query when it is downloaded


class UnknownFile(LookupError):
    """No file with this id that the caller may see (never made, deleted, or another key's)."""


class BadUpload(ValueError):
    """An upload refused as a whole; nothing of it is stored.

    Attributes:
        code: a short machine-readable reason (`empty_file`, `too_many_lines`, ...).
        message: what is wrong and where, for the user.
    """

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class File(Base):
    """One file: an uploaded batch input (`content`) or a batch's output or error file (`job_id`)."""

    __tablename__ = "files"
    __table_args__ = (
        UniqueConstraint("job_id", "kind"),
        Index("ix_files_key_id_created_at", "key_id", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_id: Mapped[str | None] = mapped_column(ForeignKey("api_keys.id"))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int] = mapped_column("bytes", BigInteger)  # the API's `bytes`
    lines: Mapped[int] = mapped_column(Integer)  # non-blank lines
    content: Mapped[bytes | None] = mapped_column(LargeBinary)  # uploads only; None once deleted
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    kind: Mapped[str | None] = mapped_column(String(16))  # "output" | "error" for batch files
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    deleted_at: Mapped[datetime | None]


def owned_by(column: Any, key_id: str | None):
    """A filter: rows of this key (or, with no keys in use, of nobody)."""
    return column.is_(None) if key_id is None else column == key_id


def jsonl(line: dict[str, Any]) -> bytes:
    """One JSONL line as stored, downloaded and counted."""
    return (json.dumps(line, ensure_ascii=False) + "\n").encode()


def check_upload(data: bytes, max_lines: int) -> int:
    """Check that an upload is a batch input file; its number of non-blank lines.

    Each line's own problems (a missing custom_id, a bad message, even broken JSON) are
    left to the batch, which reports them per line like `applespec submit`; a file is
    refused whole only when it cannot be a job file: not UTF-8, empty, over `max_lines`,
    or with no line that parses as JSON (not JSONL at all).

    Raises:
        BadUpload: with the reason.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadUpload(
            "invalid_file_format", f"the file is not UTF-8 text (byte {e.start} is not UTF-8)"
        ) from e
    lines = text.splitlines()
    count = sum(1 for line in lines if line.strip())
    if count == 0:
        raise BadUpload("empty_file", "the file has no requests (every line is blank)")
    if count > max_lines:
        raise BadUpload(
            "too_many_lines",
            f"the file has {count} requests; at most {max_lines} are allowed per file",
        )
    _, errors = parse_job(lines)
    not_json = [e for e in errors if e.code == "invalid_json"]
    if len(not_json) == count:
        raise BadUpload(
            "invalid_file_format",
            f"the file is not JSONL: no line is a JSON value ({not_json[0].message})",
        )
    return count


def store_upload(
    session: Session, *, key_id: str | None, filename: str, purpose: str, data: bytes, lines: int
) -> File:
    """Store a checked upload in one row. Commits."""
    file = File(
        id=f"file-{uuid.uuid4().hex[:24]}",
        key_id=key_id,
        purpose=purpose,
        filename=filename,
        size=len(data),
        lines=lines,
        content=data,
        created_at=utcnow(),
    )
    session.add(file)
    session.commit()
    return file


def get_file(session: Session, file_id: str, key_id: str | None) -> File:
    """The caller's file `file_id`; another key's file is as unknown as a missing one."""
    file = session.scalars(
        select(File).where(
            File.id == file_id, owned_by(File.key_id, key_id), File.deleted_at.is_(None)
        )
    ).first()
    if file is None:
        raise UnknownFile(f"No such File object: {file_id}")
    return file


def list_files(
    session: Session, key_id: str | None, *, limit: int, after: str | None, purpose: str | None
) -> tuple[list[File], bool]:
    stmt = select(File).where(owned_by(File.key_id, key_id), File.deleted_at.is_(None))
    if purpose is not None:
        stmt = stmt.where(File.purpose == purpose)
    return newest_first(session, stmt, File, limit=limit, after=after)


def delete_file(session: Session, file: File) -> None:
    """Delete a file: its bytes go at once; the row stays so a batch's file ids stay unique."""
    file.deleted_at = utcnow()
    file.content = None
    session.commit()


def upload_lines(session: Session, file: File) -> list[str]:
    """An upload's lines (checked UTF-8 when it was stored)."""
    data = session.scalar(select(File.content).where(File.id == file.id))
    return (data or b"").decode("utf-8").splitlines()


def content_chunks(session: Session, file: File) -> Iterator[bytes]:
    """A file's bytes, a piece at a time: slices of an upload, or a batch file's output lines."""
    if file.job_id is None:
        for start in range(1, file.size + 1, READ_CHUNK):  # SQL substr is 1-based
            piece = session.scalar(
                select(func.substr(File.content, start, READ_CHUNK)).where(File.id == file.id)
            )
            if piece is None:  # deleted meanwhile
                return
            yield bytes(piece)
        return
    buffer: list[bytes] = []
    size = 0
    for line in output_file_lines(session, file.job_id, file.kind):
        data = jsonl(line)
        buffer.append(data)
        size += len(data)
        if size >= READ_CHUNK // 16:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


def output_file_lines(session: Session, job_id: str, kind: str) -> Iterator[dict[str, Any]]:
    """The lines of a job's output file (`kind="output"`: results) or error file (`"error"`)."""
    want = kind == "output"
    for ok, line in repo.output_lines(session, job_id):
        if ok == want:
            yield line


def make_output_files(session: Session, job_id: str, key_id: str | None) -> dict[str, str | None]:
    """Create a finished job's output and error file rows; their ids by kind (None: no lines).

    The bytes and line counts are counted by streaming the lines once. Flushes; the caller
    commits (a concurrent call for the same job fails the unique (job_id, kind) and rolls back).
    """
    ids: dict[str, str | None] = {}
    for kind in ("output", "error"):
        size = count = 0
        for line in output_file_lines(session, job_id, kind):
            size += len(jsonl(line))
            count += 1
        if count == 0:
            ids[kind] = None
            continue
        file = File(
            id=f"file-{uuid.uuid4().hex[:24]}",
            key_id=key_id,
            purpose=OUTPUT_PURPOSE,
            filename=f"{job_id}_{kind}.jsonl",
            size=size,
            lines=count,
            content=None,
            job_id=job_id,
            kind=kind,
            created_at=utcnow(),
        )
        session.add(file)
        ids[kind] = file.id
    session.flush()
    return ids
