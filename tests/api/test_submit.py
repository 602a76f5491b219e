"""`applespec submit` and `run` against hostile input and hostile settings, on SQLite and
PostgreSQL: per-line errors identical on both stores, nothing valid lost, limits, drafter
paths refused, credentials masked, idempotent submits, retry and cancel after a dead worker.

Needs Redis (submit queues chunks) but no worker: nothing here waits for results from one.
"""

from __future__ import annotations

import json
import time

import pytest
import redis
from click.testing import CliRunner

from api.cli import cli
from core.jobs import CUSTOM_ID_MAX
from core.store import repo
from tests.api.jobfiles import read_jsonl
from tests.worker.service import SHARED_REDIS, Store, free_port, service_env, unique_model
from worker.app import queue_name

pytestmark = pytest.mark.service


def _body(**body):
    body.setdefault("messages", [{"role": "user", "content": "hello"}])
    return body


def _line(custom_id, url="/v1/chat/completions", **body):
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": url, "body": _body(**body)}
    ).encode()


# One line of each hostile kind, with the error it must get (None: it must run).
HOSTILE: list[tuple[bytes, str | None]] = [
    (
        _line(
            "dev",
            model="gpt-3.5-turbo-0125",
            messages=[
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            ],
            max_tokens=5,
        ),
        None,
    ),
    (b'{"custom_id": "enc", "prompt": "caf\xe9 \xff"}', "invalid_encoding"),
    (json.dumps({"custom_id": "x" * 600, "prompt": "p"}).encode(), "invalid_custom_id"),
    (json.dumps({"custom_id": "nul\u0000", "prompt": "p"}).encode(), "invalid_custom_id"),
    (b'{"custom_id": "sur", "prompt": "a \\ud800 b"}', "invalid_text"),
    (b"[" * 50_000 + b"]" * 50_000, "too_deep"),
    (b'{"custom_id": "big", "prompt": "' + b"x" * 20_000_000 + b'"}', "line_too_long"),
    (
        _line(
            "fmt",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "object", "not": {}}},
            },
        ),
        "invalid_response_format",
    ),
    (_line("json", response_format={"type": "json_object"}, max_tokens=4), None),
    (_line("stop", stop=["\n"], n=2, logprobs=True, presence_penalty=0.5), None),
    (
        json.dumps(
            {
                "custom_id": "cmpl",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": "tiny-random", "prompt": "Once upon", "max_tokens": 4},
            }
        ).encode(),
        None,
    ),
    (bytes(range(10)), "invalid_json"),  # a binary file's lines
    (bytes(range(11, 256)), "invalid_encoding"),
    (json.dumps({"custom_id": "short", "prompt": "The", "max_tokens": 3}).encode(), None),
    (json.dumps({"custom_id": "x" * CUSTOM_ID_MAX, "prompt": "p", "max_tokens": 2}).encode(), None),
]


def _hostile_file(path):
    path.write_bytes(b"\n".join(line for line, _ in HOSTILE) + b"\n")
    return str(path)


def _stored(url: str, job_id: str) -> list[tuple]:
    store = Store(url)
    try:
        return [
            (i.line, i.custom_id, i.status, i.error_code, i.error_message, i.request)
            for i in store.items(job_id)
        ]
    finally:
        store.dispose()


def _comparable(line: dict) -> dict:
    """An output line without what differs between two runs (ids, times, drafter stats)."""
    line = {k: v for k, v in line.items() if k != "id"}
    if line["response"]:
        body = line["response"]["body"]
        line["response"] = {
            "choices": body["choices"],
            "usage": body["usage"],
            "model": body["model"],
            "object": body["object"],
        }
    return line


@pytest.mark.slow
def test_a_hostile_file_gives_the_same_per_line_errors_and_results_on_both_stores(
    tmp_path, sqlite_url, postgres_url
):
    path = _hostile_file(tmp_path / "hostile.jsonl")
    expected = {n: code for n, (_, code) in enumerate(HOSTILE, start=1) if code}
    model = unique_model()
    stored, outputs = {}, {}
    broker = redis.Redis.from_url(SHARED_REDIS)
    try:
        for name, url in (("sqlite", sqlite_url), ("postgresql", postgres_url)):
            env = service_env(url)
            start = time.monotonic()
            result = CliRunner(env=env).invoke(cli, ["submit", path, "--model", model, "--json"])
            assert result.exit_code == 0, result.output
            assert time.monotonic() - start < 20  # the 20 MB line is skipped, not parsed
            job = json.loads(result.stdout)
            assert job["request_counts"]["total"] == len(HOSTILE)  # every line is in the job
            assert job["queued"] == len(HOSTILE) - len(expected)
            stored[name] = _stored(url, job["id"])
            out = tmp_path / f"{name}.jsonl"
            run = CliRunner(env=env).invoke(
                cli, ["run", path, "--model", model, "-o", str(out), "--draft", "none"]
            )
            assert run.exit_code == 1, run.output  # some lines failed
            assert "Traceback" not in run.output
            outputs[name] = [_comparable(line) for line in read_jsonl(out)]
    finally:
        broker.delete(queue_name(model))
        broker.close()
    assert stored["sqlite"] == stored["postgresql"]
    got = {line: code for line, _, status, code, _, _ in stored["sqlite"] if status == "invalid"}
    assert got == expected
    assert outputs["sqlite"] == outputs["postgresql"]
    by_id = {o["custom_id"]: o for o in outputs["sqlite"]}
    assert by_id["dev"]["response"]["model"] == model  # the model that ran, not gpt-3.5
    assert by_id["cmpl"]["response"]["object"] == "text_completion"
    assert by_id["short"]["response"]["object"] == "chat.completion"
    errors = [o for o in outputs["sqlite"] if o["error"]]
    assert sorted(e["error"]["code"] for e in errors) == sorted(expected.values())
    assert all(e["error"]["message"].startswith("line ") for e in errors)
    big = next(e for e in errors if e["error"]["code"] == "line_too_long")
    assert big["error"]["message"] == (
        "line 7: the line has 20000034 bytes, above the limit of 1048576 (APPLESPEC_MAX_LINE_BYTES)"
    )


def test_file_and_request_limits_refuse_the_whole_file_before_storing(tmp_path):
    db = f"sqlite:///{tmp_path / 'limits.db'}"
    path = _prompt_file(tmp_path / "job.jsonl", 5)
    for extra, message in (
        (
            {"APPLESPEC_MAX_LINES": "4"},
            "Error: more than 4 requests in one job (APPLESPEC_MAX_LINES)",
        ),
        ({"APPLESPEC_MAX_FILE_BYTES": "100"}, f"Error: {path} has "),
    ):
        env = service_env(db, **extra)
        for command in (["submit", str(path)], ["run", str(path), "-o", str(tmp_path / "o")]):
            result = CliRunner(env=env).invoke(cli, [*command, "--model", "tiny-random"])
            assert result.exit_code == 1, result.output
            assert result.output.startswith(message), result.output
    listed = CliRunner(env=service_env(db)).invoke(cli, ["jobs", "--json"])
    assert json.loads(listed.stdout) == []


@pytest.mark.real_model
def test_submit_validates_with_the_tokenizer_alone(tmp_path, monkeypatch):
    import core.engine
    import core.models.loading

    def no_weights(*_a, **_k):
        raise AssertionError("submit loaded the model's weights")

    monkeypatch.setattr(core.models.loading, "load_model", no_weights)
    monkeypatch.setattr(core.engine.Engine, "load", no_weights)
    db = f"sqlite:///{tmp_path / 'tok.db'}"
    env = service_env(db)
    path = tmp_path / "job.jsonl"
    lines = [
        {"custom_id": "ok", "prompt": "Hello"},
        {"custom_id": "long", "prompt": "word " * 9000},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = CliRunner(env=env).invoke(cli, ["submit", str(path), "--model", "smollm2-135m"])
    try:
        assert result.exit_code == 0, result.output
        assert "context of 8192 tokens" in result.output
        assert "1 queued" in result.output
    finally:
        redis.Redis.from_url(SHARED_REDIS).delete(queue_name("smollm2-135m"))


def test_drafter_paths_are_refused_at_submit_without_touching_them(tmp_path):
    db = f"sqlite:///{tmp_path / 'draft.db'}"
    env = service_env(db)
    path = tmp_path / "job.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "prompt": "p"}) + "\n")
    messages = []
    for spec in ("draft-model:/etc/passwd", "draft-model:/no/such/file", "draft-model:../x"):
        result = CliRunner(env=env).invoke(
            cli, ["submit", str(path), "--model", "tiny-random", "--draft", spec]
        )
        assert result.exit_code == 1
        assert result.output.count("\n") == 1 and "Traceback" not in result.output
        messages.append(result.output.replace(spec.split(":", 1)[1], "PATH"))
    assert messages[0] == messages[1]  # the message says nothing about the file
    assert "a draft model must be a registry alias" in messages[0]
    assert json.loads(CliRunner(env=env).invoke(cli, ["jobs", "--json"]).stdout) == []
    model = unique_model()
    ok = CliRunner(env=env).invoke(
        cli, ["submit", str(path), "--model", model, "--draft", "draft-model:tiny-random:5"]
    )
    redis.Redis.from_url(SHARED_REDIS).delete(queue_name(model))
    assert ok.exit_code == 0, ok.output


def test_credentials_never_appear_in_messages(tmp_path):
    secret = "s3cr3t-pw"
    db = f"sqlite:///{tmp_path / 'cred.db'}"
    env = service_env(db, broker_url=f"redis://:{secret}@127.0.0.1:{free_port()}/0")
    path = tmp_path / "job.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "prompt": "p"}) + "\n")
    result = CliRunner(env=env).invoke(cli, ["submit", str(path), "--model", "tiny-random"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot reach the broker at redis://:***@127.0.0.1:")
    # retry of a stored job, with the broker down
    store = Store(db)
    with store.sessions() as s:
        job = repo.create_job(s, model="tiny-random", requests=[], errors=[], queue="q")
        repo.mark_in_progress(s, job.id)
        s.commit()
    store.dispose()
    retry = CliRunner(env=env).invoke(cli, ["retry", job.id])
    assert retry.exit_code == 1 and "redis://:***@" in retry.output
    outputs = [result.output, retry.output]
    pg = f"postgresql+psycopg://postgres:{secret}@127.0.0.1:{free_port()}/nope"
    for command in (["status", "batch_x"], ["db", "upgrade"], ["worker", "--model", "tiny-random"]):
        out = CliRunner(env=service_env(pg)).invoke(cli, command)
        assert out.exit_code == 1, (command, out.output)
        assert out.output.startswith("Error: cannot "), (command, out.output)
        outputs.append(out.output)
    assert "postgresql+psycopg://postgres:***@127.0.0.1:" in outputs[-1]
    for output in outputs:
        assert secret not in output


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("MAX_ATTEMPTS", "abc", "APPLESPEC_MAX_ATTEMPTS must be a whole number >= 1, got 'abc'"),
        ("CHUNK_SIZE", "0", "APPLESPEC_CHUNK_SIZE must be a whole number >= 1, got 0"),
        (
            "VISIBILITY_TIMEOUT",
            "-60",
            "APPLESPEC_VISIBILITY_TIMEOUT must be a whole number >= 1, got -60",
        ),
        (
            "LEASE_TIMEOUT",
            "soon",
            "APPLESPEC_LEASE_TIMEOUT must be a number of seconds >= 0.2, got 'soon'",
        ),
    ],
)
def test_bad_settings_are_one_line_errors_and_store_nothing(tmp_path, name, value, message):
    db = f"sqlite:///{tmp_path / 'set.db'}"
    env = service_env(db, **{f"APPLESPEC_{name}": value})
    path = tmp_path / "job.jsonl"
    path.write_text(json.dumps({"custom_id": "a", "prompt": "p"}) + "\n")
    for command in (
        ["submit", str(path), "--model", "tiny-random"],
        ["worker", "--model", "tiny-random"],
        ["retry", "batch_x"],
    ):
        result = CliRunner(env=env).invoke(cli, command)
        assert result.exit_code == 1
        assert result.output == f"Error: {message}\n"
    good = CliRunner(env=service_env(db)).invoke(cli, ["jobs", "--json"])
    assert json.loads(good.stdout) == []


def test_a_worker_refuses_a_missing_database(tmp_path):
    env = service_env(f"sqlite:///{tmp_path / 'none.db'}", migrated=False)
    result = CliRunner(env=env).invoke(cli, ["worker", "--model", "tiny-random"])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: no database at sqlite:///{tmp_path / 'none.db'}")
    assert not (tmp_path / "none.db").exists()


def _prompt_file(path, n: int):
    """A job file of `n` prompt lines c0..c{n-1}."""
    path.write_text(
        "".join(json.dumps({"custom_id": f"c{i}", "prompt": "p"}) + "\n" for i in range(n))
    )
    return path


def test_a_repeated_idempotency_key_returns_the_first_job(tmp_path, monkeypatch):
    from api.client import Client
    from core.settings import Settings

    db = f"sqlite:///{tmp_path / 'idem.db'}"
    env = service_env(db)
    model = unique_model()
    path = _prompt_file(tmp_path / "job.jsonl", 5)
    broker = redis.Redis.from_url(SHARED_REDIS)
    args = ["submit", str(path), "--model", model, "--idempotency-key", "nightly-1"]
    try:
        first = CliRunner(env=env).invoke(cli, args)
        assert first.exit_code == 0, first.output
        queued = broker.llen(queue_name(model))
        assert queued == 3  # chunks of 2
        again = CliRunner(env=env).invoke(cli, args)
        assert again.exit_code == 0, again.output
        job_id = first.stdout.strip().splitlines()[-1]
        assert again.stdout.strip().splitlines()[-1] == job_id
        assert f"{job_id}: already submitted with key 'nightly-1'" in again.output
        assert broker.llen(queue_name(model)) == queued  # nothing queued twice
        replay = json.loads(CliRunner(env=env).invoke(cli, [*args, "--json"]).stdout)
        assert replay["replayed"] is True and replay["id"] == job_id
        path.write_text(json.dumps({"custom_id": "other", "prompt": "p"}) + "\n")
        clash = CliRunner(env=env).invoke(cli, args)
        assert clash.exit_code == 1
        assert clash.output == (
            f"Error: idempotency key 'nightly-1' was used for job {job_id} with other lines "
            "or options; use a new key for a new job\n"
        )
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        client = Client(Settings.from_env())
        requests = [{"custom_id": "a", "prompt": "p"}]
        one = client.submit(requests, model=model, idempotency_key="client-1")
        two = client.submit(requests, model=model, idempotency_key="client-1")
        assert one["id"] == two["id"] and two["replayed"]
        assert len(json.loads(CliRunner(env=env).invoke(cli, ["jobs", "--json"]).stdout)) == 2
    finally:
        broker.delete(queue_name(model))
        broker.close()


def test_retry_and_cancel_after_the_worker_died(tmp_path):
    """A worker died holding items (leases expired, no sweeper alive): `retry` queues them
    again, and `cancel` of another such job ends `cancelled`, not `cancelling`."""
    db = f"sqlite:///{tmp_path / 'dead.db'}"
    env = service_env(db)
    model = unique_model()
    path = _prompt_file(tmp_path / "job.jsonl", 3)
    broker = redis.Redis.from_url(SHARED_REDIS)
    try:
        job_ids = []
        for _ in range(2):
            out = CliRunner(env=env).invoke(cli, ["submit", str(path), "--model", model])
            assert out.exit_code == 0, out.output
            job_ids.append(out.stdout.strip().splitlines()[-1])
        store = Store(db)
        with store.sessions() as s:  # what a worker killed mid-chunk leaves behind
            for job_id in job_ids:
                ids = repo.open_item_ids(s, job_id)
                repo.lease_items(s, job_id, ids, "deadhost:1", -1)
                repo.claim_item(s, ids[0], "deadhost:1", -1, 3)
        broker.delete(queue_name(model))
        retry = CliRunner(env=env).invoke(cli, ["retry", job_ids[0]])
        assert retry.exit_code == 0, retry.output
        assert retry.output == f"{job_ids[0]}: 3 requests queued again\n"
        assert broker.llen(queue_name(model)) == 2
        assert {i.status for i in store.items(job_ids[0])} == {"pending"}
        cancel = CliRunner(env=env).invoke(cli, ["cancel", job_ids[1]])
        assert cancel.output == f"{job_ids[1]}: cancelled\n"
        assert {i.status for i in store.items(job_ids[1])} == {"cancelled"}
        store.dispose()
    finally:
        broker.delete(queue_name(model))
        broker.close()
