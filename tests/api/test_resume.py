"""Jobs resume: `retry` re-queues a cancelled job's requests and a worker runs them; an
`applespec run` whose process died is `interrupted` (not `in_progress` forever) and the same
command resumes it from the stored results."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import redis
from click.testing import CliRunner

from api.cli import cli
from tests.api.jobfiles import read_jsonl
from tests.support import hooked_cli
from tests.worker.service import (
    ROOT,
    SHARED_REDIS,
    Store,
    Worker,
    cli_ok,
    service_env,
    unique_model,
)
from worker.app import queue_name


def _prompts(path, n: int) -> str:
    path.write_text(
        "".join(
            json.dumps({"custom_id": f"c{i}", "prompt": f"p{i}", "max_tokens": 4}) + "\n"
            for i in range(n)
        )
    )
    return str(path)


@pytest.mark.slow
def test_cancel_then_retry_resumes_the_job_and_a_worker_finishes_it(tmp_path):
    db = f"sqlite:///{tmp_path / 'resume.db'}"
    model = unique_model()
    env = service_env(db)
    path = _prompts(tmp_path / "job.jsonl", 4)
    broker = redis.Redis.from_url(SHARED_REDIS)
    store = Store(db)
    worker = None
    try:
        job_id = cli_ok(env, "submit", path, "--model", model).strip().splitlines()[-1]
        assert cli_ok(env, "cancel", job_id).strip() == f"{job_id}: cancelled"
        broker.delete(queue_name(model))  # what the cancel left queued is dropped by workers
        retry = CliRunner(env=env).invoke(cli, ["retry", job_id])
        assert retry.exit_code == 0, retry.output
        assert retry.output == f"{job_id}: 4 requests queued again\n"
        assert store.job(job_id).status == "in_progress"
        assert {i.status for i in store.items(job_id)} == {"pending"}
        worker = Worker(env, model, tmp_path / "worker.log")
        worker.wait_ready()
        store.wait_for(lambda: store.job(job_id).status == "completed", 120, "completed")
        assert store.job(job_id).completed == 4
    finally:
        if worker is not None:
            worker.stop()
        broker.delete(queue_name(model))
        broker.close()
        store.dispose()


def _run(env: dict[str, str], *args: str, crash: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        hooked_cli.command("run", *args, crash=crash),
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_killed_run_is_interrupted_and_the_same_command_resumes_it(tmp_path):
    db = f"sqlite:///{tmp_path / 'run.db'}"
    env = service_env(db)
    job = _prompts(tmp_path / "job.jsonl", 6)
    out = str(tmp_path / "out.jsonl")
    args = (job, "-o", out, "--model", "tiny-random", "--draft", "none")
    # The run process dies (os._exit) right after it stores its first result.
    died = _run(env, *args, crash=",".join(f"c{i}" for i in range(6)))
    assert died.returncode == 70, died.stderr
    (listed,) = json.loads(cli_ok(env, "jobs", "--json"))
    job_id = listed["id"]
    status = json.loads(cli_ok(env, "status", job_id, "--json"))
    assert status["status"] == "cancelled"  # not in_progress forever
    assert status["request_counts"]["completed"] == 1
    assert status["resumable"] == 5
    assert "run the same `applespec run` command again" in cli_ok(env, "status", job_id)
    store = Store(db)
    try:
        items = store.items(job_id)
        assert {i.error_code for i in items if i.status != "completed"} == {"interrupted"}
        first = next(i.custom_id for i in items if i.status == "completed")
        resumed = _run(env, *args)
        assert resumed.returncode == 0, resumed.stderr
        assert f"resuming {job_id}: 1 results stored, 5 to run" in resumed.stderr
        lines = read_jsonl(out)
        assert [line["custom_id"] for line in lines] == [f"c{i}" for i in range(6)]
        assert all(line["error"] is None for line in lines)
        final = json.loads(cli_ok(env, "status", job_id, "--json"))
        assert final["status"] == "completed" and final["resumable"] == 0
        assert final["request_counts"] == {"total": 6, "completed": 6, "failed": 0}
        assert len(json.loads(cli_ok(env, "jobs", "--json"))) == 1  # resumed, not started over
        again = {i.custom_id: i.attempts for i in store.items(job_id)}
        assert again[first] == 1  # the stored result was not run again
        assert set(store.results_per_item(job_id).values()) == {1}
    finally:
        store.dispose()
