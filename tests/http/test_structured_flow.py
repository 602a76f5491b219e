"""The official `openai` client's batch flow with `response_format` lines, over HTTP: every
answer is valid under its schema, a schema the engine cannot follow is that line's error."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.worker.service import cli_ok

from .flow import request_line, wait_done, write_jsonl

pytestmark = pytest.mark.service

SCHEMA = {
    "type": "object",
    "properties": {
        "product": {"type": "string", "maxLength": 12},
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["product", "sentiment", "stars"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA, "strict": True}}


def test_response_format_batch_flow(farm):
    client = farm.client()
    lines = [
        request_line(f"s{i}", f"Label this review: item {i} broke", 200, response_format=FORMAT)
        for i in range(3)
    ]
    lines.append(request_line("obj", "Any JSON", 200, response_format={"type": "json_object"}))
    bad = {"type": "json_schema", "json_schema": {"name": "b", "schema": {"not": {}}}}
    lines.append(request_line("bad", "x", 20, response_format=bad))
    path = write_jsonl(farm.tmp / "structured.jsonl", lines)
    file = client.files.create(file=open(path, "rb"), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_done(client, batch.id)
    assert batch.status == "completed"
    assert batch.request_counts.completed == 4 and batch.request_counts.failed == 1
    results = {
        r["custom_id"]: r
        for r in map(json.loads, client.files.content(batch.output_file_id).text.splitlines())
    }
    for i in range(3):
        body = results[f"s{i}"]["response"]["body"]
        assert body["choices"][0]["finish_reason"] == "stop"
        jsonschema.validate(json.loads(body["choices"][0]["message"]["content"]), SCHEMA)
    obj = results["obj"]["response"]["body"]["choices"][0]
    if obj["finish_reason"] == "stop":  # a random model may fill the object past 200 tokens
        assert isinstance(json.loads(obj["message"]["content"]), dict)
    status = json.loads(cli_ok(farm.env, "status", batch.id, "--json"))["metrics"]
    assert status["forced_tokens"] > 0 and status["mask_s"] > 0  # summed over the items
    (error,) = map(json.loads, client.files.content(batch.error_file_id).text.splitlines())
    assert error["custom_id"] == "bad"
    assert error["error"]["code"] == "invalid_response_format"
    assert "not" in error["error"]["message"]
