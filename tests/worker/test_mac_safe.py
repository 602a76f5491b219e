"""A worker that is safe where fork and MLX do not mix (macOS), shown by what Linux can show.

- The parent of a prefork pool never loads MLX: its memory maps hold no libmlx, while the
  pool process that ran the job does.
- `--pool solo` (the default on macOS) runs a job in one process that never forks.
- In a worker process MLX is first imported, and every eval runs, on the runtime's engine
  thread: mlx-lm's generation stream is made on the thread that uses it (mlx-lm #1090).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from api.cli import cli
from api.service_cmds import default_pool
from tests.worker.service import (
    ROOT,
    SHARED_REDIS,
    Store,
    Worker,
    service_env,
    submit,
    unique_model,
)
from worker.app import queue_name

pytestmark = [pytest.mark.service, pytest.mark.slow]


def _maps_mlx(pid: int) -> bool:
    return "/mlx/" in Path(f"/proc/{pid}/maps").read_text()


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _job(tmp_path, n: int = 3) -> Path:
    path = tmp_path / "job.jsonl"
    path.write_text(
        "".join(
            json.dumps({"custom_id": f"c{i}", "prompt": "p", "max_tokens": 4}) + "\n"
            for i in range(n)
        )
    )
    return path


def _run_one_job(tmp_path, extra: tuple[str, ...]):
    db = f"sqlite:///{tmp_path / 'w.db'}"
    env = service_env(db)
    model = unique_model()
    store = Store(db)
    worker = Worker(env, model, tmp_path / "worker.log", extra=extra)
    try:
        worker.wait_ready()
        job_id = submit(env, _job(tmp_path), model)
        store.wait_for(lambda: store.job(job_id).status == "completed", 120, "the job done")
        yield worker
    finally:
        worker.stop()
        store.dispose()
        redis.Redis.from_url(SHARED_REDIS).delete(queue_name(model))


@pytest.mark.slow
def test_the_parent_of_a_prefork_pool_never_loads_mlx(tmp_path):
    for worker in _run_one_job(tmp_path, ("--pool", "prefork")):
        children = _children(worker.pid)
        assert children, "no pool process"
        assert not _maps_mlx(worker.pid), "the parent loaded MLX before forking its pool"
        assert any(_maps_mlx(c) for c in children), "no pool process loaded MLX"


@pytest.mark.slow
def test_a_solo_pool_runs_the_job_in_one_process_that_never_forks(tmp_path):
    for worker in _run_one_job(tmp_path, ("--pool", "solo")):
        assert _children(worker.pid) == []  # no pool process: the model runs here
        assert _maps_mlx(worker.pid)


def test_solo_is_the_default_on_macos(monkeypatch):
    assert default_pool() == ("solo" if sys.platform == "darwin" else "prefork")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert default_pool() == "solo"
    monkeypatch.setattr(sys, "platform", "linux")
    assert default_pool() == "prefork"


def test_solo_with_several_processes_is_a_clear_error(tmp_path):
    env = service_env(f"sqlite:///{tmp_path / 'w.db'}")
    result = CliRunner(env=env).invoke(cli, ["worker", "--pool", "solo", "--concurrency", "2"])
    assert result.exit_code == 1 and "start several workers" in result.output


def test_mlx_is_imported_and_evaluated_only_on_the_engine_thread():
    script = ROOT / "tests" / "worker" / "engine_thread_probe.py"
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["loaded_early"] == []
    assert seen["imported_on"] == {
        "mlx.core": "applespec-engine",
        "mlx_lm.generate": "applespec-engine",
    }
    assert seen["eval_threads"] == ["applespec-engine"]
    assert seen["errors"] == []
