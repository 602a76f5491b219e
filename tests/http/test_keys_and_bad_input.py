"""API keys and bad input over HTTP, against the real server of the farm.

Every refusal is OpenAI's error body with the 4xx that names it; the server keeps answering
and nothing of a refused request is stored.
"""

from __future__ import annotations

import io
import json

import httpx
import openai
import pytest
from sqlalchemy import func, select

from core.store.batches import Batch
from core.store.files import File
from core.store.models import Job
from tests.worker.service import cli_ok

from .conftest import MAX_FILE_BYTES, MAX_LINES
from .flow import wait_done

pytestmark = pytest.mark.service

LINE = {
    "custom_id": "a",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
}


def jsonl(*lines) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def upload(client, data: bytes, name: str = "in.jsonl", purpose: str = "batch"):
    return client.files.create(file=(name, io.BytesIO(data)), purpose=purpose)


def counts(farm) -> dict[str, int]:
    with farm.store.sessions() as s:
        return {
            model.__tablename__: s.scalar(select(func.count()).select_from(model))
            for model in (File, Batch, Job)
        }


def error_of(e: openai.APIStatusError) -> dict:
    body = e.response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    return body["error"]


@pytest.mark.slow
def test_a_second_key_sees_nothing_of_the_first(farm):
    owner, other = farm.client(), farm.client(farm.new_key("other team"))
    file = upload(owner, jsonl(LINE))
    batch = owner.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    finished = wait_done(owner, batch.id)
    assert finished.status == "completed" and finished.output_file_id is not None
    attempts = {
        "file": lambda: other.files.retrieve(file.id),
        "file content": lambda: other.files.content(file.id),
        "file delete": lambda: other.files.delete(file.id),
        "batch": lambda: other.batches.retrieve(batch.id),
        "output": lambda: other.files.content(finished.output_file_id),
        "cancel": lambda: other.batches.cancel(batch.id),
        "batch from its file": lambda: other.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    }
    for what, attempt in attempts.items():
        with pytest.raises(openai.NotFoundError) as e:
            attempt()
        assert error_of(e.value)["message"].startswith("No such"), what
    assert batch.id not in [b.id for b in other.batches.list()]
    assert file.id not in [f.id for f in other.files.list()]
    # The owner still has everything.
    assert owner.files.retrieve(file.id).id == file.id
    assert owner.files.content(finished.output_file_id).text.count("\n") == 1


@pytest.mark.slow
def test_no_key_unknown_key_and_revoked_key_get_401(farm):
    for headers in ({}, {"Authorization": "Bearer as-not-a-key"}, {"Authorization": "Basic x"}):
        r = httpx.get(farm.base_url + "/batches", headers=headers, timeout=10)
        assert r.status_code == 401, headers
        assert r.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
    token = farm.new_key("short-lived")
    client = farm.client(token)
    assert client.batches.list().data == []
    key_id = json.loads(cli_ok(farm.env, "keys", "list", "--json"))[-1]["id"]
    assert "revoked" in cli_ok(farm.env, "keys", "revoke", key_id)
    with pytest.raises(openai.AuthenticationError) as e:
        client.batches.list()
    assert error_of(e.value)["code"] == "invalid_api_key"
    assert farm.client().batches.list() is not None  # other keys are untouched


@pytest.mark.parametrize(
    "case",
    ["not_jsonl", "not_utf8", "empty", "too_many_lines", "wrong_purpose", "oversized"],
)
def test_bad_uploads(farm, case):
    client = farm.client()
    data, purpose, status, code = {
        "not_jsonl": (b"name,label\nfoo,1\nbar,0\n", "batch", 400, "invalid_file_format"),
        "not_utf8": (b"\xff\xfe{}\n", "batch", 400, "invalid_file_format"),
        "empty": (b"\n\n", "batch", 400, "empty_file"),
        "too_many_lines": (jsonl(*[LINE] * (MAX_LINES + 1)), "batch", 400, "too_many_lines"),
        "wrong_purpose": (jsonl(LINE), "fine-tune", 400, "invalid_purpose"),
        "oversized": (b"x" * (MAX_FILE_BYTES + 1), "batch", 413, "file_too_large"),
    }[case]
    before = counts(farm)
    with pytest.raises(openai.APIStatusError) as e:
        upload(client, data, purpose=purpose)
    assert e.value.status_code == status
    error = error_of(e.value)
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert error["param"] in ("file", "purpose")
    assert counts(farm) == before  # nothing stored
    assert client.batches.list(limit=1) is not None  # still answering


def test_a_huge_body_is_refused_before_it_is_read(farm):
    body = b"x" * (MAX_FILE_BYTES + 200_000)
    r = httpx.post(
        farm.base_url + "/files",
        headers={
            "Authorization": f"Bearer {farm.key}",
            "Content-Type": "multipart/form-data; boundary=b",
        },
        content=body,
        timeout=10,
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "file_too_large"


@pytest.mark.slow
def test_bad_batch_requests(farm):
    client = farm.client()
    good = upload(client, jsonl(LINE))
    done = client.batches.create(
        input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    output_file = wait_done(client, done.id).output_file_id
    assert output_file is not None
    before = counts(farm)
    cases = [
        (dict(input_file_id="file-nope"), 404, "input_file_id"),
        (dict(endpoint="/v1/embeddings"), 400, "endpoint"),
        (dict(completion_window="1h"), 400, "completion_window"),
        (dict(metadata={"k": "v" * 600}), 400, "metadata"),
        (dict(input_file_id=output_file), 400, "input_file_id"),  # an output is no input
    ]
    for change, status, param in cases:
        params = dict(
            input_file_id=good.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        params.update(change)
        with pytest.raises(openai.APIStatusError) as e:
            client.batches.create(**params)
        assert e.value.status_code == status, change
        assert error_of(e.value)["param"] == param, change
    # Not JSON at all, and a missing field: 400 with the field named.
    headers = {"Authorization": f"Bearer {farm.key}", "Content-Type": "application/json"}
    r = httpx.post(farm.base_url + "/batches", headers=headers, content=b"{nope", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(farm.base_url + "/batches", headers=headers, json={"endpoint": "x"}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_file_id"
    r = httpx.get(farm.base_url + "/nothing-here", headers=headers, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["message"] == "no such route"
    assert counts(farm) == before
    assert farm.server.alive()


def test_deleted_file_is_gone(farm):
    client = farm.client()
    file = upload(client, jsonl(LINE))
    assert client.files.delete(file.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        )


def test_one_broken_line_is_that_line_s_error_not_the_file_s(farm):
    client = farm.client()
    data = jsonl(LINE) + b'{"custom_id": "b", "prompt": \n' + jsonl({**LINE, "custom_id": "c"})
    file = upload(client, data, name="résumé.jsonl")
    batch = wait_done(
        client,
        client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id,
    )
    assert batch.request_counts.completed == 2 and batch.request_counts.failed == 1
    (error,) = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert error["error"]["code"] == "invalid_json"
    assert error["error"]["message"].startswith("line 2: invalid JSON")
    assert client.files.content(file.id).content == data
    assert client.files.retrieve(file.id).filename == "résumé.jsonl"
    r = httpx.get(
        f"{farm.base_url}/files/{file.id}/content",
        headers={"Authorization": f"Bearer {farm.key}"},
        timeout=10,
    )
    assert r.headers["content-disposition"] == "attachment; filename*=UTF-8''r%C3%A9sum%C3%A9.jsonl"
