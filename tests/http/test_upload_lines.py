"""HTTP uploads get the CLI's per-line errors, and the upload limit holds while streaming.

Against the farm's real `applespec serve` (SQLite and PostgreSQL): a line nested too deep
or not UTF-8 is that line's error in the batch's error file, the valid lines run; a chunked
body past the limit is refused after about the limit's bytes, checked by what the server
process wrote (/proc/PID/io).
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from .conftest import MAX_FILE_BYTES
from .flow import wait_done
from .test_keys_and_bad_input import LINE, jsonl, upload

pytestmark = pytest.mark.service


def run_batch(client, data: bytes):
    file = upload(client, data)
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return wait_done(client, batch.id)


def errors_of(client, batch) -> list[dict]:
    return [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]


def test_a_line_nested_ten_thousand_deep_is_that_line_s_too_deep(farm):
    client = farm.client()
    deep = b"[" * 10_000 + b"]" * 10_000 + b"\n"
    data = jsonl(LINE) + deep + jsonl({**LINE, "custom_id": "c"})
    batch = run_batch(client, data)
    assert batch.status == "completed"
    assert batch.request_counts.completed == 2 and batch.request_counts.failed == 1
    (error,) = errors_of(client, batch)
    assert error["error"]["code"] == "too_deep"
    assert error["error"]["message"].startswith("line 2: JSON nested deeper than")
    assert farm.server.alive()


def test_a_line_that_is_not_utf8_is_that_line_s_invalid_encoding(farm):
    client = farm.client()
    data = (
        jsonl(LINE) + b'{"custom_id": "b\xff", "prompt": "x"}\n' + jsonl({**LINE, "custom_id": "c"})
    )
    batch = run_batch(client, data)
    assert batch.request_counts.completed == 2 and batch.request_counts.failed == 1
    (error,) = errors_of(client, batch)
    assert error["error"]["code"] == "invalid_encoding"
    assert error["error"]["message"].startswith("line 2: not UTF-8 text (byte 0xff")
    # The upload is kept byte for byte.
    assert client.files.retrieve(batch.input_file_id).bytes == len(data)


def written_by(pid: int) -> int:
    """Bytes the process has passed to write() so far (files, sockets, logs)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError(f"no wchar in /proc/{pid}/io")


def chunked_upload(url: str, key: str, total: int, piece: int = 64 * 1024) -> bytes:
    """POST a multipart upload of `total` file bytes as chunks (no Content-Length); the reply."""
    host, port = url.removeprefix("http://").split(":")
    boundary = "applespec-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"'
        "\r\nContent-Type: application/octet-stream\r\n\r\n"
    ).encode()
    line = jsonl(LINE)
    chunk = line * (piece // len(line))
    sock = socket.create_connection((host, int(port)), timeout=30)
    try:
        sock.sendall(
            (
                "POST /v1/files HTTP/1.1\r\n"
                f"Host: {host}:{port}\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
                "Transfer-Encoding: chunked\r\n\r\n"
            ).encode()
        )
        try:
            for part in (
                [head] + [chunk] * (total // len(chunk)) + [f"\r\n--{boundary}--\r\n".encode()]
            ):
                sock.sendall(b"%x\r\n%s\r\n" % (len(part), part))
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: its answer is already on the way
        reply = b""
        try:
            while data := sock.recv(65536):
                reply += data
                if b"\r\n\r\n" in reply and reply.rstrip().endswith(b"}"):
                    break
        except (ConnectionResetError, TimeoutError):
            pass
        return reply
    finally:
        sock.close()


def test_a_chunked_upload_over_the_limit_is_stopped_at_the_limit(farm):
    total = 48 * MAX_FILE_BYTES  # 3 MiB against a 64 KiB limit: past the 1 MiB kept in memory
    pid = farm.server.proc.pid
    before = written_by(pid)
    reply = chunked_upload(farm.server.url, farm.key, total)
    written = written_by(pid) - before
    # The old server spooled the whole body (3 MiB) to a temporary file before refusing it.
    assert written < 4 * MAX_FILE_BYTES, written
    assert reply.startswith(b"HTTP/1.1 413"), reply[:200]
    assert b'"file_too_large"' in reply
    assert farm.server.alive()
    assert upload(farm.client(), jsonl(LINE)).bytes == len(jsonl(LINE))  # still answering
