"""The batch service end to end: real Redis, real `applespec worker` processes, SQLite store.

Each test gets a random `tiny-random:SEED` model, so its queue is its own on the shared Redis.
"""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from api.cli import cli
from migrations import upgrade
from tests.api.jobfiles import GOOD, mixed_lines, read_jsonl, write_job

from .service import (
    RedisServer,
    Store,
    Worker,
    cli_ok,
    free_port,
    service_env,
    submit,
    unique_model,
    write_prompts,
)

pytestmark = [pytest.mark.service, pytest.mark.slow]


@pytest.fixture(scope="module")
def farm(tmp_path_factory):
    """One worker for the end-to-end, poison and cancel tests (max 2 attempts; a poison id)."""
    tmp = tmp_path_factory.mktemp("farm")
    db = f"sqlite:///{tmp / 'farm.db'}"
    env = service_env(
        db,
        APPLESPEC_MAX_ATTEMPTS="2",
        APPLESPEC_IDLE_WARNING="0.5",  # a live worker never draws the warning
    )
    upgrade(db)
    model = unique_model()
    worker = Worker(env, model, tmp / "worker.log", crash="poison")
    store = Store(db)
    try:
        worker.wait_ready()
        yield env, model, store, tmp
    finally:
        worker.stop()
        store.dispose()


@pytest.mark.slow
def test_submit_wait_results(farm):
    env, model, store, tmp = farm
    lines, expected = mixed_lines()
    path = write_job(tmp / "job.jsonl", [line.replace("tiny-random", model) for line in lines])
    job_id = submit(env, path, model)
    assert job_id.startswith("batch_")
    waited = CliRunner(env=env).invoke(cli, ["wait", job_id, "--timeout", "120"])
    # Bad lines make it a job with failed requests: exit 1, but the job itself completed.
    assert waited.exit_code == 1, waited.output
    assert "warning" not in waited.output
    status = json.loads(cli_ok(env, "status", job_id, "--json"))
    assert status["status"] == "completed"
    assert status["request_counts"] == {
        "total": len(expected) + 3,
        "completed": 3,
        "failed": len(expected),
    }
    assert status["metrics"]["items_measured"] == 3
    out, err = tmp / "out.jsonl", tmp / "err.jsonl"
    cli_ok(env, "results", job_id, "-o", str(out), "--errors", str(err))
    got = read_jsonl(out)
    assert [line["custom_id"] for line in got] == ["g1", "g2", "g3"]
    assert all(line["response"]["status_code"] == 200 for line in got)
    assert all(line["response"]["body"]["model"] == model for line in got)
    errors = read_jsonl(err)
    assert [e["error"]["code"] for e in errors] == [expected[n] for n in sorted(expected)]
    assert all(
        e["error"]["message"].startswith(f"line {n}: ")
        for e, n in zip(errors, sorted(expected), strict=True)
    )
    metrics = store.metrics(job_id)
    assert len(metrics) == 3
    for m in metrics.values():
        assert m.attempt == 1 and m.queue_wait_s is not None and m.total_s > 0
        assert ":" in m.worker_host and m.completion_tokens >= 1


def test_submit_reports_bad_lines_like_run(farm):
    env, model, store, tmp = farm
    lines, expected = mixed_lines()
    path = write_job(tmp / "bad.jsonl", [line.replace("tiny-random", model) for line in lines])
    result = CliRunner(env=env).invoke(cli, ["submit", str(path), "--model", model, "--json"])
    assert result.exit_code == 0, result.output
    job = json.loads(result.stdout)
    items = {i.line: i for i in store.items(job["id"])}
    for line_no, code in expected.items():
        assert items[line_no].status == "invalid"
        assert items[line_no].error_code == code
        assert items[line_no].error_message.startswith(f"line {line_no}: ")
    assert job["request_counts"]["failed"] == len(expected)
    CliRunner(env=env).invoke(cli, ["wait", job["id"], "--timeout", "120"])


@pytest.mark.slow
def test_poison_item_is_capped_and_fails_alone(farm):
    env, model, store, tmp = farm
    path = write_prompts(tmp / "poison.jsonl", ["a", "poison", "b", "c"], max_tokens=4)
    job_id = submit(env, path, model, "--chunk-size", "1")
    result = CliRunner(env=env).invoke(cli, ["wait", job_id, "--timeout", "150"])
    assert result.exit_code == 1, result.output  # one request failed
    items = {i.custom_id: i for i in store.items(job_id)}
    poison = items.pop("poison")
    assert poison.status == "failed"
    assert poison.error_code == "max_attempts_exceeded"
    assert poison.attempts == 2
    # Rows that shared the poison item's batch died with it once, then ran (after a
    # crash, a retried item runs alone): each completed, within two attempts.
    assert all(i.status == "completed" and i.attempts <= 2 for i in items.values()), {
        k: (i.status, i.attempts, i.error_code, i.error_message) for k, i in items.items()
    }
    assert store.job(job_id).status == "completed"
    out = tmp / "poison-out.jsonl"
    cli_ok(env, "results", job_id, "-o", str(out))
    by_id = {line["custom_id"]: line for line in read_jsonl(out)}
    assert by_id["poison"]["error"]["code"] == "max_attempts_exceeded"
    assert by_id["a"]["error"] is None
    # retry queues the failed item again with fresh attempts; it still kills its worker.
    assert "1 requests queued again" in cli_ok(env, "retry", job_id)
    assert store.job(job_id).status in ("in_progress", "completed")
    CliRunner(env=env).invoke(cli, ["wait", job_id, "--timeout", "150"])
    after = {i.custom_id: i for i in store.items(job_id)}
    assert after["poison"].status == "failed" and after["poison"].attempts == 2
    # the others were done: the retry touched only the failed item
    assert {k: i.attempts for k, i in after.items() if k != "poison"} == {
        k: i.attempts for k, i in items.items()
    }
    assert store.job(job_id).status == "completed"


@pytest.mark.slow
def test_cancel_stops_the_remaining_items(tmp_path):
    """Two rows at a time: a cancel stops the rows in flight and everything still queued,
    on the broker or in the worker's engine."""
    db = f"sqlite:///{tmp_path / 'cancel.db'}"
    env = service_env(
        db,
        APPLESPEC_BATCH_SIZE="2",
        APPLESPEC_HEARTBEAT_INTERVAL="0.5",
        APPLESPEC_LEASE_TIMEOUT="5",
    )
    upgrade(db)
    model = unique_model()
    store = Store(db)
    worker = Worker(env, model, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        _cancel_mid_job(env, model, store, tmp_path)
    finally:
        worker.stop()
        store.dispose()


def _cancel_mid_job(env, model, store, tmp):
    ids = [f"x{i}" for i in range(40)]
    path = write_prompts(tmp / "cancel.jsonl", ids, max_tokens=48)
    job_id = submit(env, path, model)
    store.wait_for(lambda: store.job(job_id).completed >= 2, 90, "two completed items")
    assert "cancelling" in cli_ok(env, "cancel", job_id) or store.job(job_id).status == "cancelled"
    store.wait_for(lambda: store.job(job_id).status == "cancelled", 60, "cancelled")
    items = store.items(job_id)
    done = [i for i in items if i.status == "completed"]
    cancelled = [i for i in items if i.status == "cancelled"]
    assert 2 <= len(done) < 40
    assert len(done) + len(cancelled) == 40
    results = store.results_per_item(job_id)
    assert set(results) == {i.id for i in done}
    time.sleep(1.5)  # nothing runs after the cancel settled
    assert store.results_per_item(job_id) == results
    waited = CliRunner(env=env).invoke(cli, ["wait", job_id, "--timeout", "5"])
    assert waited.exit_code == 1


@pytest.mark.slow
def test_redis_restart_mid_job_still_completes(tmp_path):
    """Our own Redis without persistence, killed and restarted: queued chunks are lost and
    the workers' sweep re-enqueues them (new broker epoch)."""
    redis_server = RedisServer(free_port(), tmp_path)
    redis_server.start()
    db = f"sqlite:///{tmp_path / 'restart.db'}"
    # Two rows at a time, 0.3 s per item: most chunks are still on the broker when it dies.
    env = service_env(db, broker_url=redis_server.url, APPLESPEC_BATCH_SIZE="2")
    upgrade(db)
    model = unique_model()
    store = Store(db)
    worker = Worker(env, model, tmp_path / "w.log", item_delay=0.3)
    try:
        worker.wait_ready()
        path = write_prompts(tmp_path / "job.jsonl", [f"r{i:02d}" for i in range(16)], 16)
        job_id = submit(env, path, model)
        store.wait_for(lambda: store.job(job_id).completed >= 3, 90, "three completed items")
        redis_server.kill()
        assert store.job(job_id).status == "in_progress"
        time.sleep(1)
        redis_server.start()
        store.wait_for(lambda: store.job(job_id).status == "completed", 120, "the job to complete")
        per_item = store.results_per_item(job_id)
        assert len(per_item) == 16 and set(per_item.values()) == {1}
        assert "re-enqueued" in (tmp_path / "w.log").read_text()
    finally:
        worker.stop()
        redis_server.kill()
        store.dispose()


def test_submit_without_broker_is_a_one_line_error(tmp_path):
    db = f"sqlite:///{tmp_path / 'nobroker.db'}"
    env = service_env(db, broker_url=f"redis://127.0.0.1:{free_port()}/0")
    path = write_job(tmp_path / "job.jsonl", GOOD)
    result = CliRunner(env=env).invoke(cli, ["submit", str(path), "--model", "tiny-random"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot reach the broker")
    assert "Traceback" not in result.output


def test_python_client_submit_wait_iterate(farm, monkeypatch):
    from api.client import Client
    from core.settings import Settings

    env, model, store, tmp = farm
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    client = Client(Settings.from_env())
    requests = [{"custom_id": f"l{i}", "prompt": f"label {i}:"} for i in range(3)]
    requests.append({"custom_id": "l0", "prompt": "duplicate"})
    job = client.submit(requests, model=model, max_tokens=3)
    assert job["invalid"] == [
        {
            "line": 4,
            "code": "duplicate_custom_id",
            "message": "line 4: duplicate custom_id 'l0' (first used on line 1)",
        }
    ]
    final = client.wait(job["id"], timeout=120)
    assert final["status"] == "completed"
    lines = list(client.results(job["id"]))
    assert [line["custom_id"] for line in lines] == ["l0", "l1", "l2", "l0"]
    assert all(line["response"]["body"]["usage"]["completion_tokens"] <= 3 for line in lines[:3])
    assert lines[3]["error"]["code"] == "duplicate_custom_id"


@pytest.mark.slow
def test_wait_warns_when_no_worker_consumes_the_queue(tmp_path, monkeypatch):
    import redis

    from api.client import Client, JobTimeout, NoWorkerWarning
    from core.settings import Settings
    from worker.app import queue_name

    db = f"sqlite:///{tmp_path / 'idle.db'}"
    env = service_env(db, APPLESPEC_IDLE_WARNING="0.3")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    model = unique_model()  # nobody consumes its queue
    client = Client(Settings.from_env())
    job = client.submit([{"custom_id": "a", "prompt": "x"}], model=model)
    try:
        waited = CliRunner(env=env).invoke(
            cli, ["wait", job["id"], "--timeout", "1.5", "--interval", "0.1"]
        )
        assert waited.exit_code == 2, waited.output
        assert waited.output.count("warning:") == 1
        assert f"warning: no worker has consumed queue {queue_name(model)} for " in waited.output
        assert f"(none seen yet); start one: applespec worker --model {model}" in waited.output
        with pytest.warns(NoWorkerWarning, match="no worker has consumed queue"):
            with pytest.raises(JobTimeout, match="still in_progress"):
                client.wait(job["id"], timeout=1.0, interval=0.1)
        assert client.cancel(job["id"]) == "cancelled"
    finally:
        redis.Redis.from_url(env["APPLESPEC_BROKER_URL"]).delete(queue_name(model))


@pytest.mark.slow
def test_two_workers_on_postgresql(postgres_url, tmp_path):
    """The farm setup: PostgreSQL store, two workers sharing one job's queue."""
    env = service_env(postgres_url)
    upgrade(postgres_url)
    model = unique_model()
    store = Store(postgres_url)
    workers = [Worker(env, model, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        path = write_prompts(tmp_path / "job.jsonl", [f"p{i:02d}" for i in range(12)], 8)
        job_id = submit(env, path, model, "--chunk-size", "1")
        waited = CliRunner(env=env).invoke(cli, ["wait", job_id, "--timeout", "120"])
        assert waited.exit_code == 0, waited.output
        per_item = store.results_per_item(job_id)
        assert len(per_item) == 12 and set(per_item.values()) == {1}
        hosts = {m.worker_host for m in store.metrics(job_id).values()}
        assert len(hosts) == 2  # both workers took chunks
        out = tmp_path / "out.jsonl"
        cli_ok(env, "results", job_id, "-o", str(out))
        assert [line["custom_id"] for line in read_jsonl(out)] == [f"p{i:02d}" for i in range(12)]
    finally:
        for w in workers:
            w.stop()
        store.dispose()


@pytest.mark.slow
def test_a_workers_self_drafter_learns_while_the_job_runs(tmp_path):
    """`--draft adapter:1` with nothing stored: the worker's adapter starts untrained and
    learns from the job's rows (APPLESPEC_LEARN_SHARE=1). Each item's metrics carry the
    version it finished with; `status --json`
    shows the latest one and the acceptance over the job's items in finish order."""
    db = f"sqlite:///{tmp_path / 'learn.db'}"
    env = service_env(
        db,
        APPLESPEC_LEARN_SHARE="1",
        APPLESPEC_BATCH_SIZE="4",
        APPLESPEC_HOME=str(tmp_path / "home"),
    )
    upgrade(db)
    model = unique_model()
    store = Store(db)
    worker = Worker(env, model, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        path = write_prompts(tmp_path / "job.jsonl", [f"label {i}" for i in range(40)], 24)
        job_id = submit(env, path, model, "--draft", "adapter:1", "--k", "3")
        store.wait_for(
            lambda: store.job(job_id).status == "completed", 180, "the job to complete", job=job_id
        )
        metrics = sorted(store.metrics(job_id).values(), key=lambda m: m.id)  # finish order
        versions = [m.speculative["adapter_version"] for m in metrics]
        # Recorded per item and never going back (whether a version beats the untrained one
        # within 40 rows depends on the random model's seed: the engine tests show the climb).
        assert all(isinstance(v, int) for v in versions) and versions == sorted(versions)
        status = json.loads(cli_ok(env, "status", job_id, "--json"))
        assert status["metrics"]["adapter_version"] == versions[-1]
        curve = status["metrics"]["acceptance_over_time"]
        assert [p["items"] for p in curve] == [4 * (i + 1) for i in range(10)]
        assert all(0 <= p["acceptance_rate"] <= 1 for p in curve)
    finally:
        worker.stop()
        store.dispose()
