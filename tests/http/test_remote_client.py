"""api.remote.RemoteClient: a pipeline on another machine with only a base URL and a key.

A real `applespec serve` and a real worker on a fresh store; the client's own process has
no usable database or broker settings. It submits (one bad line among good ones), cancels
before any worker runs, retries, follows progress with its ETA, streams the results and
the errors.
"""

from __future__ import annotations

import types

import pytest

from api.remote import RemoteClient, RemoteError
from tests.worker.service import Store, Worker, cli_ok, service_env, unique_model

from .server import Server

pytestmark = pytest.mark.service


@pytest.mark.slow
def test_a_pipeline_needs_only_the_url_and_a_key(tmp_path, monkeypatch, capsys):
    db = f"sqlite:///{tmp_path / 'store.db'}"
    model = unique_model()
    env = service_env(db, APPLESPEC_MODEL=model)
    key = cli_ok(env, "keys", "create", "pipeline").strip().splitlines()[-1]
    server = Server(env, tmp_path / "server.log")
    store = Store(db)
    worker = None
    # This process knows no store and no broker: only the server's URL and the key.
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", f"sqlite:///{tmp_path / 'nothing-here.db'}")
    monkeypatch.setenv("APPLESPEC_BROKER_URL", "redis://127.0.0.1:1/0")
    try:
        server.wait_ready()
        with pytest.raises(RemoteError) as refused:
            RemoteClient(server.url, key="as-wrong").batch("batch_x")
        assert refused.value.status == 401
        farm = RemoteClient(server.url, key=key)
        lines = [
            {"custom_id": f"q{i}", "prompt": f"Label {i} ->", "max_tokens": 4} for i in range(3)
        ]
        lines.insert(1, {"custom_id": "bad", "prompt": "x", "max_tokens": -1})
        batch = farm.submit(lines)
        assert farm.cancel(batch["id"])["status"] == "cancelled"  # no worker has run it
        assert farm.retry(batch["id"]) == 3  # the three valid requests, not the bad line
        assert farm.status(batch["id"])["status"] == "in_progress"
        worker = Worker(env, model, tmp_path / "worker.log")
        done = farm.wait(batch["id"], timeout=120, interval=0.2, progress=True)
        assert done["status"] == "completed"
        assert done["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
        assert f"{batch['id']}: completed 4/4" in capsys.readouterr().err
        results = farm.results(batch["id"])
        assert isinstance(results, types.GeneratorType)  # streamed as it downloads
        assert [r["custom_id"] for r in results] == ["q0", "q1", "q2"]
        (error,) = farm.errors(batch["id"])
        assert error["custom_id"] == "bad" and error["error"]["code"] == "invalid_parameter"
        status = farm.status(batch["id"])
        assert {"eta", "energy", "resumable"} <= set(status) and status["resumable"] == 0
        farm.close()
    finally:
        server.stop()
        if worker is not None:
            worker.stop()
        store.dispose()
