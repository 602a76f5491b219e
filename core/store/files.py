"""Files of the HTTP API: uploaded batch inputs (kept in SQL) and batch outputs (streamed).

An upload is checked line by line (the same split and per-line checks as a job file on
disk) before anything is stored, then stored in one row. A batch's
output and error files hold no bytes of their own: their content is the job's output lines,
read from the result rows a slice at a time whenever it is downloaded.
"""

from __future__ import annotations

import io
import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any, BinaryIO

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
    func,
    insert,
    select,
    text,
)
from sqlalchemy.orm import Mapped, Session, mapped_column

from core.jobs import JobLimits, LongLine, parse_job, stream_job_lines

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
    # Uploads only; None once deleted. Deferred: a row is loaded without its bytes.
    content: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
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


def check_upload(f: BinaryIO, limits: JobLimits) -> int:
    """Check that an upload (a binary file, read from its start) is a batch input file.

    The lines are split and decoded as `applespec submit` splits them (core.jobs.
    stream_job_lines, parse_job), one line at a time: each line's own problems (bytes that
    are not UTF-8, a line past the size limit, JSON nested too deep, a missing custom_id)
    are left to the batch, which reports them per line. A file is refused whole only when
    it cannot be a job file: empty, over `limits.lines`, or with no line that parses as JSON
    (not JSONL at all).

    Returns:
        The number of non-blank lines.

    Raises:
        BadUpload: with the reason.
    """
    f.seek(0)
    count = 0
    first_problem: str | None = None
    any_json = False
    for number, raw in enumerate(stream_job_lines(_Unclosed(f), limits.line_bytes), start=1):
        if not isinstance(raw, LongLine) and not raw.strip():
            continue
        count += 1
        if count > limits.lines:
            raise BadUpload(
                "too_many_lines",
                f"the file has more than {limits.lines} requests; at most {limits.lines} "
                "are allowed per file",
            )
        if any_json:
            continue
        _, errors = parse_job([raw], limits=limits)
        bad = [e for e in errors if e.code in NOT_JSONL]
        if bad:
            first_problem = first_problem or bad[0].message.replace("line 1:", f"line {number}:", 1)
        else:
            any_json = True
    f.seek(0)
    if count == 0:
        raise BadUpload("empty_file", "the file has no requests (every line is blank)")
    if not any_json:
        raise BadUpload(
            "invalid_file_format",
            f"the file is not JSONL: no line is a JSON value ({first_problem})",
        )
    return count


# Per-line errors that say a line is not JSON text at all; a file of nothing else is no JSONL.
NOT_JSONL = ("invalid_json", "invalid_encoding")


class _Unclosed:
    """A file object whose `close` (at the end of stream_job_lines) leaves the file open."""

    def __init__(self, f: BinaryIO):
        self.readline = f.readline

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def store_upload(
    session: Session, *, key_id: str | None, filename: str, purpose: str, f: BinaryIO, lines: int
) -> File:
    """Store a checked upload (the binary file `f`, from its start) in one row. Commits.

    On SQLite the bytes are written a slice at a time into a zeroblob of the file's size
    (incremental blob I/O), so the upload is never whole in memory; other databases take
    it as one parameter.
    """
    f.seek(0, io.SEEK_END)
    size = f.tell()
    f.seek(0)
    sqlite = session.get_bind().dialect.name == "sqlite"
    file_id = f"file-{uuid.uuid4().hex[:24]}"
    session.execute(
        insert(File).values(
            id=file_id,
            key_id=key_id,
            purpose=purpose,
            filename=filename,
            size=size,
            lines=lines,
            content=func.zeroblob(size) if sqlite else f.read(),
            created_at=utcnow(),
        )
    )
    if sqlite:
        rowid = session.scalar(select(text("rowid")).select_from(File).where(File.id == file_id))
        driver = session.connection().connection.driver_connection
        with driver.blobopen("files", "content", rowid) as blob:
            while piece := f.read(READ_CHUNK):
                blob.write(piece)
    file = session.get(File, file_id)
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


def upload_lines(session: Session, file: File, limits: JobLimits) -> Iterator[bytes | LongLine]:
    """An upload's lines as raw bytes, split as a job file on disk is (stream_job_lines)."""
    data = session.scalar(select(File.content).where(File.id == file.id))
    return stream_job_lines(io.BytesIO(data or b""), limits.line_bytes)


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
