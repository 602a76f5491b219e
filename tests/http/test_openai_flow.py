"""The official `openai` package against `applespec serve`: the documented batch flow, cancel,
list with pagination, the report and /metrics of the same jobs, on SQLite and PostgreSQL.

Real Redis, a real `applespec worker` subprocess (tiny random model) and a real server.
"""

from __future__ import annotations

import base64
import html
import io
import json
import re

import httpx
import openai
import pytest
from PIL import Image
from sqlalchemy import select

from core.store.models import Item, Metric
from tests.worker.service import cli_ok

from .flow import request_line, wait_done, write_jsonl

pytestmark = pytest.mark.service


@pytest.fixture(scope="module")
def finished(farm):
    """The documented flow's batch, run once per backend: (batch, output lines, error lines)."""
    client = farm.client()
    lines = [request_line(f"q{i}", f"Label the sentiment: review {i} was great") for i in range(5)]
    lines.insert(
        2,
        {
            "custom_id": "broken",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": []},
        },
    )
    path = write_jsonl(farm.tmp / "batch_input.jsonl", lines)

    # The OpenAI documentation's flow, unchanged but for base_url.
    batch_input_file = client.files.create(file=open(path, "rb"), purpose="batch")
    batch = client.batches.create(
        input_file_id=batch_input_file.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"description": "nightly eval job"},
    )
    assert batch.status in ("validating", "in_progress", "finalizing", "completed")
    batch = wait_done(client, batch.id)
    output = client.files.content(batch.output_file_id).text
    errors = client.files.content(batch.error_file_id).text
    return batch_input_file, batch, output, errors


def test_documented_batch_flow(farm, finished):
    input_file, batch, output, errors = finished
    assert input_file.object == "file" and input_file.purpose == "batch"
    assert input_file.bytes == (farm.tmp / "batch_input.jsonl").stat().st_size
    assert batch.object == "batch" and batch.status == "completed"
    assert batch.endpoint == "/v1/chat/completions" and batch.completion_window == "24h"
    assert batch.input_file_id == input_file.id
    assert batch.metadata == {"description": "nightly eval job"}
    assert batch.model == farm.model  # "gpt-4o-mini" is not served here: the default model
    assert batch.request_counts.total == 6
    assert batch.request_counts.completed == 5 and batch.request_counts.failed == 1
    for stamp in ("created_at", "in_progress_at", "finalizing_at", "completed_at"):
        assert isinstance(getattr(batch, stamp), int), stamp
    assert batch.created_at <= batch.in_progress_at <= batch.completed_at
    assert batch.failed_at is None and batch.cancelled_at is None

    results = [json.loads(line) for line in output.splitlines()]
    assert [r["custom_id"] for r in results] == [f"q{i}" for i in range(5)]
    for r in results:
        assert r["error"] is None and r["response"]["status_code"] == 200
        body = r["response"]["body"]
        assert body["object"] == "chat.completion" and body["model"] == farm.model
        # a random tiny model may end an answer at once (EOS first): then it says "stop"
        used = body["usage"]["completion_tokens"]
        assert used >= 1 or body["choices"][0]["finish_reason"] == "stop"
        assert isinstance(body["choices"][0]["message"]["content"], str)
    assert batch.usage.output_tokens == sum(
        r["response"]["body"]["usage"]["completion_tokens"] for r in results
    )
    (bad,) = [json.loads(line) for line in errors.splitlines()]
    assert bad["custom_id"] == "broken" and bad["response"] is None
    assert bad["error"]["code"] == "invalid_messages"
    assert bad["error"]["message"] == "line 3: body.messages must be a non-empty list"

    client = farm.client()
    out_file = client.files.retrieve(batch.output_file_id)
    assert out_file.purpose == "batch_output" and out_file.bytes == len(output.encode())
    assert client.files.retrieve(batch.error_file_id).bytes == len(errors.encode())
    assert (
        client.files.content(input_file.id).content == (farm.tmp / "batch_input.jsonl").read_bytes()
    )
    # The same lines `applespec results` writes from the CLI.
    cli_out = farm.tmp / "cli_results.jsonl"
    cli_ok(farm.env, "results", batch.id, "-o", str(cli_out), "--errors", str(farm.tmp / "e.jsonl"))
    assert cli_out.read_text() == output


@pytest.mark.slow
def test_cancel(farm):
    client = farm.client()
    total = 80
    # Answers of very different lengths: a batch finishes its short ones long before the rest.
    # The longest run thousands of steps, so the job cannot end within the heartbeat that
    # carries the cancel to the worker's running rows (a CI run saw 80 of 80 complete with
    # answers of at most 950 tokens and a 5 s heartbeat).
    lines = [
        request_line(f"c{i}", f"Write a long story number {i}", max_tokens=2 + 48 * i)
        for i in range(total)
    ]
    path = write_jsonl(farm.tmp / "cancel.jsonl", lines)
    file = client.files.create(file=open(path, "rb"), purpose="batch")
    batch = client.batches.create(
        input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    farm.store.wait_for(lambda: farm.store.job(batch.id).completed >= 2, 90, "two completed items")
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    assert isinstance(cancelled.cancelling_at, int)
    batch = wait_done(client, batch.id, timeout=60)
    assert batch.status == "cancelled" and isinstance(batch.cancelled_at, int)
    counts = batch.request_counts
    assert 2 <= counts.completed < total and counts.total == total
    done = [json.loads(x) for x in client.files.content(batch.output_file_id).text.splitlines()]
    stopped = [json.loads(x) for x in client.files.content(batch.error_file_id).text.splitlines()]
    assert len(done) == counts.completed
    assert len(done) + len(stopped) == total
    assert {e["error"]["code"] for e in stopped} == {"cancelled"}
    # Cancelling a cancelled batch again is harmless (a completed one is refused: list test).
    assert client.batches.cancel(batch.id).status == "cancelled"


def test_list_with_pagination(farm, finished):
    client = farm.client()
    path = write_jsonl(farm.tmp / "small.jsonl", [request_line("one", "hi", max_tokens=2)])
    file = client.files.create(file=open(path, "rb"), purpose="batch")
    made = [
        client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for _ in range(3)
    ]
    page = client.batches.list(limit=2)
    assert len(page.data) == 2 and page.has_more is True
    assert [b.id for b in page.data] == made[::-1][:2]  # newest first
    second = client.batches.list(limit=2, after=page.data[-1].id)
    assert second.data[0].id == made[0]
    # Auto-pagination walks every page: the three new batches, then the earlier ones.
    every = [b.id for b in client.batches.list(limit=2)]
    assert every[:3] == made[::-1]
    assert finished[1].id in every and len(every) == len(set(every))
    with pytest.raises(openai.BadRequestError) as bad:
        client.batches.list(after="batch_nope")
    assert bad.value.status_code == 400
    for batch_id in made:
        wait_done(client, batch_id)
    with pytest.raises(openai.BadRequestError) as done:
        client.batches.cancel(made[0])
    assert done.value.status_code == 400 and "already completed" in done.value.message


def test_report_matches_status(farm, finished):
    batch = finished[1]
    report = farm.tmp / "report.html"
    cli_ok(farm.env, "report", batch.id, "-o", str(report))
    page = report.read_text()
    status = json.loads(cli_ok(farm.env, "status", batch.id, "--json"))
    rows = re.findall(r'<tr data-key="([^"]+)" data-value="([^"]*)">', page)
    assert len(rows) >= 12
    for key, value in rows:
        expected = status
        for part in key.split("."):
            expected = expected[part]
        assert json.loads(html.unescape(value)) == expected, key
    pngs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(pngs) == 6  # five figures, and the batch size each item ran at
    for data in pngs:
        image = Image.open(io.BytesIO(base64.b64decode(data)))
        image.verify()
        assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
    assert "http://" not in page and "https://" not in page  # self-contained


def test_metrics_match_the_store(farm, finished):
    def scrape() -> tuple[str, dict[str, float]]:
        text = httpx.get(farm.server.url + "/metrics", timeout=10).text
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return text, values

    # The broker monitor answers within a few seconds of the server's start.
    _, values = farm.store.wait_for(
        lambda: (got := scrape())[1].get("applespec_workers_online") and got, 20, "workers online"
    )
    # Other workers may share this Redis; this farm's own is among those online.
    assert values["applespec_workers_online"] >= 1
    assert f'applespec_queue_chunks{{queue="applespec.{farm.model}"}}' in values
    label = f'{{model_name="{farm.model}"}}'
    with farm.store.sessions() as s:
        rows = s.scalars(select(Metric)).all()
        statuses = [i.status for i in s.scalars(select(Item))]
    assert rows and statuses
    assert values[f"vllm:spec_decode_num_draft_tokens_total{label}"] == sum(
        m.draft_tokens for m in rows
    )
    assert values[f"vllm:spec_decode_num_accepted_tokens_total{label}"] == sum(
        m.accepted_tokens for m in rows
    )
    assert values[f"vllm:spec_decode_num_emitted_tokens_total{label}"] == sum(
        m.completion_tokens for m in rows
    )
    per_pos = f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="{farm.model}",position="0"}}'
    assert values[per_pos] == sum((m.speculative["accepted_per_position"] or [0])[0] for m in rows)
    assert values[f"applespec_items_completed_total{label}"] == statuses.count("completed")
    failed = statuses.count("failed") + statuses.count("invalid")
    assert values[f"applespec_items_failed_total{label}"] == failed
    assert values[f"applespec_items_cancelled_total{label}"] == statuses.count("cancelled")
    assert values[f"vllm:num_requests_waiting{label}"] == statuses.count("pending") == 0
    assert values[f"applespec_queue_depth{label}"] == 0
    assert f"applespec_tokens_per_second{label}" in values
