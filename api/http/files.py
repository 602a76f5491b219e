"""`/v1/files`: upload a batch input file, read, list, download and delete files."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile
from starlette.types import Message, Receive

from core.store import files
from core.store.pagination import UnknownCursor
from core.store.repo import aware

from .auth import owner
from .errors import OpenAIError, not_found

router = APIRouter(prefix="/v1")


def unix(dt) -> int | None:
    return int(aware(dt).timestamp()) if dt is not None else None


def file_object(f: files.File) -> dict[str, Any]:
    """OpenAI's File object."""
    return {
        "id": f.id,
        "object": "file",
        "bytes": f.size,
        "created_at": unix(f.created_at),
        "expires_at": None,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "status_details": None,
    }


def too_large(limit: int) -> OpenAIError:
    return OpenAIError(
        413,
        f"the file is larger than this server's upload limit of {limit} bytes "
        "(APPLESPEC_MAX_FILE_BYTES)",
        param="file",
        code="file_too_large",
    )


# Bytes of multipart framing (boundaries, part headers, the purpose field) allowed on top of
# the file itself before the body counts as over the limit.
FORM_FRAMING = 64 * 1024


class _BodyTooLarge(Exception):
    """The request body went past the limit while it was being read."""


def _counted(receive: Receive, limit: int) -> Receive:
    """`receive`, counting the body's bytes as they arrive: past `limit` it raises."""
    seen = 0

    async def receive_counted() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge
        return message

    return receive_counted


@router.post("/files")
async def create_file(request: Request, key_id: str | None = Depends(owner)) -> dict[str, Any]:
    """Upload a batch input file (multipart: `file`, `purpose=batch`).

    The key is checked and a declared size compared with the limit before the body is read.
    The body is then counted as it arrives, chunked or not: once past the limit reading
    stops, the partial file is removed and the answer is 413. The file part is spooled to
    a temporary file (not held in memory) and checked line by line (core.store.files.
    check_upload) before it is stored.
    """
    settings = request.app.state.settings
    limit = settings.max_file_bytes
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit + FORM_FRAMING:
        raise too_large(limit)
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise OpenAIError(
            400,
            "upload the file as multipart/form-data with the fields `file` and `purpose`",
            code="invalid_content_type",
        )
    counted = Request(request.scope, _counted(request.receive, limit + FORM_FRAMING))
    try:
        form = await counted.form(max_files=1, max_fields=16)
    except _BodyTooLarge:  # the parser has closed (removed) its spooled files
        raise too_large(limit) from None
    except Exception as e:  # a malformed multipart body
        raise OpenAIError(400, f"cannot read the multipart form: {e}", code="invalid_form") from e
    try:
        purpose = form.get("purpose")
        upload = form.get("file")
        if not isinstance(purpose, str) or not purpose:
            raise OpenAIError(400, "missing required parameter: 'purpose'", param="purpose")
        if purpose != files.INPUT_PURPOSE:
            raise OpenAIError(
                400,
                f"purpose {purpose!r} is not supported here: this server takes batch input "
                f"files (purpose={files.INPUT_PURPOSE!r})",
                param="purpose",
                code="invalid_purpose",
            )
        if not isinstance(upload, UploadFile):
            raise OpenAIError(400, "missing required parameter: 'file' (a file part)", param="file")
        if upload.size is None or upload.size > limit:
            raise too_large(limit)
        filename = upload.filename or "upload.jsonl"

        def store() -> files.File:
            try:
                lines = files.check_upload(upload.file, settings.job_limits())
            except files.BadUpload as e:
                raise OpenAIError(400, e.message, param="file", code=e.code) from e
            with request.app.state.sessions() as s:
                return files.store_upload(
                    s,
                    key_id=key_id,
                    filename=filename,
                    purpose=purpose,
                    f=upload.file,
                    lines=lines,
                )

        return file_object(await run_in_threadpool(store))
    finally:
        await form.close()


@router.get("/files")
def list_files(
    request: Request,
    key_id: str | None = Depends(owner),
    limit: int = Query(10000, ge=1, le=10000),
    after: str | None = None,
    purpose: str | None = None,
) -> dict[str, Any]:
    with request.app.state.reader() as s:
        try:
            rows, more = files.list_files(s, key_id, limit=limit, after=after, purpose=purpose)
        except UnknownCursor as e:
            raise OpenAIError(400, str(e), param="after") from e
        data = [file_object(f) for f in rows]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


def _file(request: Request, file_id: str, key_id: str | None) -> files.File:
    with request.app.state.reader() as s:
        try:
            return files.get_file(s, file_id, key_id)
        except files.UnknownFile as e:
            raise not_found(str(e), param="file_id") from e


@router.get("/files/{file_id}")
def retrieve_file(
    request: Request, file_id: str, key_id: str | None = Depends(owner)
) -> dict[str, Any]:
    return file_object(_file(request, file_id, key_id))


@router.delete("/files/{file_id}")
def delete_file(
    request: Request, file_id: str, key_id: str | None = Depends(owner)
) -> dict[str, Any]:
    with request.app.state.sessions() as s:
        try:
            f = files.get_file(s, file_id, key_id)
        except files.UnknownFile as e:
            raise not_found(str(e), param="file_id") from e
        files.delete_file(s, f)
    return {"id": file_id, "object": "file", "deleted": True}


@router.get("/files/{file_id}/content")
def file_content(
    request: Request, file_id: str, key_id: str | None = Depends(owner)
) -> StreamingResponse:
    """The file's bytes, streamed from the store (an output file line by line from its results)."""
    f = _file(request, file_id, key_id)
    reader = request.app.state.reader

    def chunks():
        with reader() as s:
            yield from files.content_chunks(s, f)

    # The name as uploaded, percent-encoded: quotes or newlines in it cannot break the header.
    headers = {"Content-Disposition": f"attachment; filename*=UTF-8''{quote(f.filename)}"}
    if f.job_id is None:
        headers["Content-Length"] = str(f.size)
    return StreamingResponse(chunks(), media_type="application/octet-stream", headers=headers)
