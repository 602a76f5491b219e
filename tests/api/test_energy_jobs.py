"""Energy per request, job and host, from a fake NVML (a `pynvml` on PYTHONPATH) under a
real `applespec run`, from a fake RAPL tree under a real worker, and "not measured" where
the machine gives nothing: in `status --json`, the status line, the report and /metrics."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner
from fastapi.testclient import TestClient

from api.cli import cli
from tests.test_energy import rapl_tree
from tests.worker.service import (
    ROOT,
    SHARED_REDIS,
    Store,
    Worker,
    cli_ok,
    service_env,
    submit,
    unique_model,
)
from worker.app import queue_name

FAKE_NVML = ROOT / "tests" / "fakes" / "nvml"


def _job(path: Path, n: int) -> str:
    path.write_text(
        "".join(
            json.dumps({"custom_id": f"c{i}", "prompt": f"p{i}", "max_tokens": 4}) + "\n"
            for i in range(n)
        )
    )
    return str(path)


def _run(tmp_path, env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", "from api.cli import main; main()", "run"]
        + [_job(tmp_path / "job.jsonl", 3), "-o", str(tmp_path / "out.jsonl")]
        + ["--model", "tiny-random", "--draft", "none", "--json"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)["id"]


def _served(store_url: str, path: str = "/metrics"):
    """A page of the HTTP app on this store: /metrics as text, a dashboard route as JSON."""
    from api.http.app import create_app
    from core.settings import Settings

    settings = dataclasses.replace(Settings.from_env({}), database_url=store_url)
    with TestClient(create_app(settings, monitor=False)) as client:
        r = client.get(path)
        return r.text if path == "/metrics" else r.json()


def _metrics(store_url: str) -> str:
    return _served(store_url)


@pytest.mark.slow
def test_energy_from_nvml_per_request_job_and_host(tmp_path, store):
    job_id = _run(
        tmp_path,
        {
            "PYTHONPATH": f"{FAKE_NVML}{os.pathsep}{ROOT}",
            "APPLESPEC_POWERCAP": str(tmp_path / "none"),
        },
    )
    energy = json.loads(cli_ok({}, "status", job_id, "--json"))["energy"]
    # Each finished request reads both fake GPUs once more: 4 J each.
    assert energy["joules"] == pytest.approx(12.0)
    assert energy["measured_requests"] == 3 and energy["sources"] == ["nvml"]
    assert energy["hosts"]["local"]["joules"] == pytest.approx(12.0)
    tokens = json.loads(cli_ok({}, "status", job_id, "--json"))["metrics"]["completion_tokens"]
    assert energy["joules_per_1k_tokens"] == pytest.approx(12.0 * 1000 / tokens)
    assert "12.0 J" in cli_ok({}, "status", job_id) and "by nvml" in cli_ok({}, "status", job_id)
    report = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", job_id, "-o", str(report)]).exit_code == 0
    assert 'data-key="energy.joules" data-value="12.0"' in report.read_text()
    # Per request (the job page's series, in finish order) and per worker host.
    series = _served(store, f"/dashboard/jobs/{job_id}")
    per_item = [v for v in series["items"]["joules_per_1k_tokens"] if v is not None]
    assert len(per_item) == 3 and all(v > 0 for v in per_item)
    assert [w["joules"] for w in series["workers"]] == [pytest.approx(12.0)]
    dashboard = _served(store, "/dashboard/state")
    assert [j["energy_j"] for j in dashboard["jobs"]] == [pytest.approx(12.0)]
    scraped = _metrics(store)
    assert 'applespec_energy_joules_total{model_name="tiny-random",worker_host="local"} 12.0' in (
        scraped
    )


@pytest.mark.slow
def test_no_meter_is_not_measured_never_a_guess(tmp_path, store):
    job_id = _run(tmp_path, {"APPLESPEC_POWERCAP": str(tmp_path / "none")})
    energy = json.loads(cli_ok({}, "status", job_id, "--json"))["energy"]
    assert energy == {
        "joules": None,
        "joules_per_1k_tokens": None,
        "measured_requests": 0,
        "sources": [],
        "hosts": {},
    }
    assert "energy not measured" in cli_ok({}, "status", job_id)
    report = tmp_path / "report.html"
    assert CliRunner().invoke(cli, ["report", job_id, "-o", str(report)]).exit_code == 0
    assert "not measured" in report.read_text()
    assert "applespec_energy_joules_total{" not in _metrics(store)


@pytest.mark.slow
@pytest.mark.service
def test_a_worker_measures_with_rapl(tmp_path):
    db = f"sqlite:///{tmp_path / 'w.db'}"
    root = rapl_tree(tmp_path / "powercap", {0: 1000})
    env = service_env(db, APPLESPEC_POWERCAP=str(root))
    model = unique_model()
    store = Store(db)
    worker = Worker(env, model, tmp_path / "worker.log")
    try:
        worker.wait_ready()
        job_id = submit(env, Path(_job(tmp_path / "job.jsonl", 3)), model)
        store.wait_for(lambda: store.job(job_id).status == "completed", 120, "the job done")
        energy = json.loads(cli_ok(env, "status", job_id, "--json"))["energy"]
        assert energy["measured_requests"] == 3 and energy["sources"] == ["rapl"]
        assert energy["joules"] is not None and energy["joules"] >= 0
        (host,) = energy["hosts"]
        assert host.rsplit(":", 1)[-1].isdigit()  # host:pid of the pool process
    finally:
        worker.stop()
        store.dispose()
        redis.Redis.from_url(SHARED_REDIS).delete(queue_name(model))
