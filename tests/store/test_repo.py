"""Item life cycle in the store: idempotent results, attempts cap, derived job status."""

import json

import pytest
from sqlalchemy import func, select

from core.jobs import parse_job
from core.store import repo
from core.store.models import Item, Metric, Result


def _job(session, n=3, bad=("{oops",)):
    lines = [json.dumps({"custom_id": f"c{i}", "prompt": f"p{i}"}) for i in range(n)]
    requests, errors = parse_job([*lines, *bad])
    job = repo.create_job(session, model="tiny-random", requests=requests, errors=errors)
    repo.mark_in_progress(session, job.id, broker_epoch="e1")
    session.commit()
    return job


def _body(n=2):
    return {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n},
    }


METRIC = {
    "attempt": 1,
    "worker_host": "h:1",
    "completion_tokens": 2,
    "total_s": 0.25,
    "verify_steps": 1,
    "draft_tokens": 2,
    "accepted_tokens": 1,
}


def test_results_are_written_once_and_status_follows_counts(sessions):
    with sessions() as s:
        job = _job(s)
        assert job.status == "in_progress"
        assert (job.total, job.completed, job.failed) == (4, 0, 1)
        ids = repo.open_item_ids(s, job.id)
        for item_id in ids:
            item = repo.start_item(s, item_id, max_attempts=3, worker="h:1")
            assert item.status == "running" and item.attempts == 1 and item.worker == "h:1"
            assert repo.finish_item(s, item, _body(), dict(METRIC)) is True
            # A redelivered chunk: the item is done, so it is skipped ...
            assert repo.start_item(s, item_id, max_attempts=3) is None
            # ... and a second write of the same result changes nothing.
            assert repo.finish_item(s, item, _body(), dict(METRIC)) is False
        assert s.scalar(select(func.count(Result.id))) == 3
        assert s.scalar(select(func.count(Metric.id))) == 3
        summary = repo.job_summary(s, job.id)
    assert summary["status"] == "completed"
    assert summary["request_counts"] == {"total": 4, "completed": 3, "failed": 1}
    assert summary["metrics"]["acceptance_rate"] == 0.5
    assert summary["metrics"]["mean_accepted_length"] == 2.0


def test_status_shows_acceptance_climb_and_the_adapter_version(sessions):
    """Acceptance over time in finish order (what online learning makes climb) and the
    self-drafter version the latest item finished with."""
    with sessions() as s:
        job = _job(s, n=4, bad=())
        for n, item_id in enumerate(repo.open_item_ids(s, job.id)):
            item = repo.start_item(s, item_id, max_attempts=3, worker="h:1")
            metric = dict(METRIC, draft_tokens=4, accepted_tokens=n + 1)
            metric["speculative"] = {"adapter_version": n // 2}
            repo.finish_item(s, item, _body(), metric)
        metrics = repo.job_summary(s, job.id)["metrics"]
        assert repo.acceptance_over_time(s, job.id, points=2) == [
            {"items": 2, "acceptance_rate": 3 / 8},
            {"items": 4, "acceptance_rate": 7 / 8},
        ]
    assert [p["acceptance_rate"] for p in metrics["acceptance_over_time"]] == [
        0.25,
        0.5,
        0.75,
        1.0,
    ]
    assert metrics["adapter_version"] == 1


def test_an_item_that_keeps_dying_is_capped(sessions):
    with sessions() as s:
        job = _job(s, n=1, bad=())
        (item_id,) = repo.open_item_ids(s, job.id)
        for attempt in (1, 2):  # the worker dies after each start (no finish)
            assert repo.start_item(s, item_id, max_attempts=2).attempts == attempt
        assert repo.start_item(s, item_id, max_attempts=2) is None
        item = s.get(Item, item_id)
        s.refresh(item)
        assert item.status == "failed" and item.error_code == "max_attempts_exceeded"
        assert "line 1: gave up after 2 attempts" in item.error_message
        assert repo.get_job(s, job.id).status == "failed"  # nothing completed


def test_cancel_then_retry(sessions):
    with sessions() as s:
        job = _job(s, n=3, bad=())
        first, *rest = repo.open_item_ids(s, job.id)
        running = repo.start_item(s, first, max_attempts=3)
        job = repo.cancel_job(s, job.id)
        assert job.status == "cancelling"  # the running item may finish
        repo.finish_item(s, running, _body(), dict(METRIC))
        s.expire_all()
        assert repo.get_job(s, job.id).status == "cancelled"
        assert all(repo.start_item(s, i, max_attempts=3) is None for i in rest)
        lines = [line for _, line in repo.output_lines(s, job.id)]
        assert [line["custom_id"] for line in lines] == ["c0", "c1", "c2"]
        assert [line["error"]["code"] if line["error"] else None for line in lines] == [
            None,
            "cancelled",
            "cancelled",
        ]


def test_retry_resets_failed_items(sessions):
    with sessions() as s:
        job = _job(s, n=2)
        a, b = repo.open_item_ids(s, job.id)
        repo.finish_item(s, repo.start_item(s, a, 3), _body(), dict(METRIC))
        repo.start_item(s, b, 3)
        repo.fail_item(s, b, "engine_error", "line 2: boom")
        assert repo.get_job(s, job.id).status == "completed"
        assert repo.retry_job(s, job.id) == [b]  # the bad JSON line stays failed
        s.expire_all()
        job = repo.get_job(s, job.id)
        assert job.status == "in_progress" and job.failed == 1
        assert s.get(Item, b).attempts == 0


def test_unknown_job(sessions):
    with sessions() as s, pytest.raises(repo.UnknownJob, match="no job 'batch_nope'"):
        repo.job_summary(s, "batch_nope")


@pytest.mark.slow
def test_a_large_job_is_stored_and_queued_whole(sessions):
    """33k lines, past SQLite's default cap of 32766 bound parameters per statement (this
    machine's SQLite allows more, so the cap itself is not exercised here): every item is
    stored, queued in bounded batches, and sent in exactly one chunk."""
    from celery import Celery

    from worker.enqueue import enqueue

    n = 33_000
    lines = [json.dumps({"custom_id": f"c{i}", "prompt": "p"}) for i in range(n)]
    requests, errors = parse_job(lines)
    app = Celery(broker="memory://", set_as_current=False)
    sent = []
    app.send_task = lambda name, args, queue, producer: sent.append(args[1])
    with sessions() as s:
        job = repo.create_job(s, model="m", requests=requests, errors=errors, queue="q")
        repo.mark_in_progress(s, job.id)
        s.commit()
        ids = repo.open_item_ids(s, job.id)
        assert len(ids) == n
        assert enqueue(app, s, job.id, ids, chunk_size=1000) == 33
        assert sorted(i for chunk in sent for i in chunk) == sorted(ids)
        queued = s.scalar(
            select(func.count(Item.id)).where(Item.job_id == job.id, Item.queued_at.is_not(None))
        )
        assert queued == n
