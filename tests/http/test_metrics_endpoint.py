"""/metrics follows the store between scrapes (in-process app on hand-made rows)."""

from __future__ import annotations

import dataclasses

from fastapi.testclient import TestClient

from api.http.app import create_app
from core.settings import Settings
from core.store.database import make_engine, make_sessionmaker
from migrations import upgrade
from tests.store.test_job_series import _finish, _job


def _values(client) -> dict[str, float]:
    out = {}
    for line in client.get("/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_counters_move_with_the_jobs(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    settings = dataclasses.replace(Settings.from_env({}), database_url=url)
    label = '{model_name="tiny-random"}'
    with sessions() as s:
        job_id, ids = _job(s, 3)
        _finish(s, ids[0], "a:1", 4, 3, [2, 1])
    with TestClient(create_app(settings, monitor=False)) as client:
        first = _values(client)
        assert first[f"vllm:spec_decode_num_draft_tokens_total{label}"] == 4
        assert first[f"vllm:spec_decode_num_accepted_tokens_total{label}"] == 3
        assert first[f"vllm:num_requests_waiting{label}"] == 2
        with sessions() as s:
            _finish(s, ids[1], "a:1", 4, 1, [1])
        second = _values(client)
        assert second[f"vllm:spec_decode_num_draft_tokens_total{label}"] == 8
        assert second[f"vllm:spec_decode_num_accepted_tokens_total{label}"] == 4
        pos = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny-random",position="%d"}'
        assert second[pos % 0] == 3 and second[pos % 1] == 1
        assert second[f"applespec_items_completed_total{label}"] == 2
        assert second[f"vllm:num_requests_waiting{label}"] == 1
        assert second[f"applespec_tokens_per_second{label}"] == 8 / 60
        assert "applespec_workers_online" not in second  # no broker monitor in this app
    engine.dispose()


def test_a_model_whose_items_never_drafted_has_position_0_at_zero(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    settings = dataclasses.replace(Settings.from_env({}), database_url=url)
    with sessions() as s:
        _, ids = _job(s, 1)
        _finish(s, ids[0], "a:1", 0, 0, [])  # plain steps only
    with TestClient(create_app(settings, monitor=False)) as client:
        values = _values(client)
    pos = (
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="tiny-random",position="0"}'
    )
    assert values[pos] == 0
    assert values['vllm:spec_decode_num_draft_tokens_total{model_name="tiny-random"}'] == 0
    engine.dispose()
