"""A job's ETA: the requests left times the mean tokens of those done, at the job's own rate."""

from datetime import timedelta

import pytest

from core.store import repo
from core.store.models import Job, utcnow
from tests.store.test_repo import METRIC, _body, _job


def test_eta_is_unknown_before_a_measurement_and_after_the_end():
    assert repo.eta("in_progress", 5, 0, 0, 10.0)["seconds"] is None
    assert repo.eta("completed", 0, 3, 30, 10.0)["seconds"] is None


def test_eta_is_the_requests_left_at_the_measured_rate():
    # 2 done with 40 tokens in 10 s (4 tok/s, 20 tokens a request); 3 left: 60 tokens, 15 s.
    assert repo.eta("in_progress", 3, 2, 40, 10.0) == {
        "seconds": 15.0,
        "remaining_tokens": 60,
        "open_requests": 3,
    }


def test_job_summary_carries_the_eta(sessions):
    with sessions() as s:
        job = _job(s, n=4, bad=())
        ids = repo.open_item_ids(s, job.id)
        for item_id in ids[:2]:
            item = repo.start_item(s, item_id, max_attempts=3, worker="h:1")
            repo.finish_item(s, item, _body(8), {**METRIC, "completion_tokens": 8})
        row = s.get(Job, job.id)
        row.in_progress_at = utcnow() - timedelta(seconds=100)
        s.commit()
        summary = repo.job_summary(s, job.id)
        eta = summary["eta"]
        # 16 tokens done in the job's wall time so far; 2 requests of 8 tokens left: as long again.
        assert eta["open_requests"] == 2 and eta["remaining_tokens"] == 16
        assert eta["seconds"] == pytest.approx(summary["metrics"]["wall_s"], rel=1e-6)
        assert summary["metrics"]["wall_s"] >= 100
