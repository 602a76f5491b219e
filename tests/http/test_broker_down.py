"""Creating a batch while Redis is unreachable: a 503 that says so, and nothing stored."""

from __future__ import annotations

import dataclasses
import json

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from api.http.app import create_app
from core.settings import Settings
from core.store.batches import Batch
from core.store.models import Job
from tests.worker.service import free_port


def test_a_batch_without_a_broker_is_a_503_and_stores_nothing(tmp_path):
    settings = dataclasses.replace(
        Settings.from_env({}),
        database_url=f"sqlite:///{tmp_path / 's.db'}",
        broker_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        model="tiny-random:5",
    )
    line = json.dumps({"custom_id": "a", "prompt": "hi", "max_tokens": 2}).encode()
    with TestClient(create_app(settings, monitor=False)) as client:
        file = client.post(
            "/v1/files", files={"file": ("a.jsonl", line)}, data={"purpose": "batch"}
        ).json()
        r = client.post(
            "/v1/batches",
            json={
                "input_file_id": file["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["type"] == "server_error" and error["code"] == "broker_unavailable"
        assert "is Redis running?" in error["message"]
        assert client.get("/v1/batches").json()["data"] == []
        with client.app.state.reader() as s:
            assert s.scalar(select(func.count()).select_from(Job)) == 0
            assert s.scalar(select(func.count()).select_from(Batch)) == 0
