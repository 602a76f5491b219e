"""The figures' data (core.store.job_series), from hand-made metric rows with known sums."""

import json

import pytest

from core.jobs import parse_job
from core.store import job_series, repo
from core.store.database import make_engine, make_sessionmaker
from migrations import upgrade

from .test_repo import _body


@pytest.fixture
def sessions(sqlite_url):
    upgrade(sqlite_url)
    engine = make_engine(sqlite_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _finish(s, item_id, host, drafted, accepted, per_position, batch_size=None, wait=0.5):
    item = repo.start_item(s, item_id, 3, host)
    timing = {"draft_s": 0.1, "verify_s": 0.2, "accept_s": 0.05, "cache_s": 0.01, "total_s": 0.5}
    if batch_size is not None:
        timing["batch_size"] = batch_size
    metric = {
        "attempt": 1,
        "worker_host": host,
        "queue_wait_s": wait,
        "completion_tokens": 4,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "verify_steps": 2,
        **{k: v for k, v in timing.items() if k != "batch_size"},
        "speculative": {"accepted_per_position": per_position},
        "timing": timing,
    }
    repo.finish_item(s, item, _body(4), metric)


def _job(s, n):
    lines = [json.dumps({"custom_id": f"c{i}", "prompt": "p"}) for i in range(n)]
    requests, errors = parse_job(lines)
    job = repo.create_job(s, model="tiny-random", requests=requests, errors=errors)
    repo.mark_in_progress(s, job.id)
    s.commit()
    return job.id, repo.open_item_ids(s, job.id)


def test_series_in_finish_order_with_sums(sessions):
    with sessions() as s:
        job_id, ids = _job(s, 3)
        # Finish order differs from line order: 3rd, 1st, 2nd.
        _finish(s, ids[2], "a:1", 4, 4, [2, 1, 1], wait=1.0)
        _finish(s, ids[0], "b:2", 4, 0, [0], wait=2.0)
        _finish(s, ids[1], "a:7", 0, 0, [], wait=3.0)  # another process on host a
        series = job_series.job_series(s, job_id)
    items = series["items"]
    assert items["acceptance"] == [1.0, 0.0, None]  # no drafts: no rate, not 0
    assert items["cumulative_acceptance"] == [1.0, 0.5, 0.5]
    assert items["queue_wait_s"] == [1.0, 2.0, 3.0]
    assert items["batch_size"] is None and series["totals"]["mean_batch_size"] is None
    assert series["per_position"] == [2, 1, 1]
    split = series["time_split"]
    assert split["draft"] == pytest.approx(0.3) and split["verify"] == pytest.approx(0.6)
    assert split["other"] == pytest.approx(1.5 - 0.3 - 0.6 - 0.15 - 0.03)
    workers = {w["host"]: w for w in series["workers"]}  # host:pid grouped by host
    assert workers["a"]["items"] == 2 and workers["a"]["tokens"] == 8
    assert workers["a"]["processes"] == 2
    assert workers["b"]["engine_tokens_per_s"] == pytest.approx(4 / 0.5)
    assert series["summary"]["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert series["totals"]["accepted_tokens"] == 4 and series["totals"]["draft_tokens"] == 8


def test_batch_size_is_shown_when_the_engine_reports_it(sessions):
    with sessions() as s:
        job_id, ids = _job(s, 2)
        _finish(s, ids[0], "a:1", 2, 1, [1], batch_size=8)
        _finish(s, ids[1], "a:1", 2, 1, [1], batch_size=4)
        series = job_series.job_series(s, job_id)
    assert series["items"]["batch_size"] == [8.0, 4.0]
    assert series["totals"]["mean_batch_size"] == 6.0


def test_long_series_are_averaged_in_buckets(sessions):
    with sessions() as s:
        job_id, ids = _job(s, 5)
        for i, item_id in enumerate(ids):
            _finish(s, item_id, "a:1", 2, i % 2 * 2, [1], wait=float(i))
        series = job_series.job_series(s, job_id, max_points=2)
    assert series["items"]["bucket"] == 3
    assert series["items"]["queue_wait_s"] == [1.0, 3.5]
    assert series["items"]["count"] == 5
