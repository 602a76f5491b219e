"""The Celery app's settings and the broker-loss sweep, without a live worker."""

import fakeredis
import pytest

from core.jobs import parse_job
from core.settings import Settings
from core.store import repo
from core.store.database import make_engine, make_sessionmaker
from migrations import upgrade
from worker import enqueue as enqueue_mod
from worker.app import TASK_NAME, create_app, queue_name
from worker.sweeper import sweep


def test_queue_name_per_model():
    assert queue_name("smollm2-135m") == "applespec.smollm2-135m"
    assert queue_name("tiny-random:3") == "applespec.tiny-random:3"
    assert queue_name("/models/My Model.gguf") == "applespec.models_My_Model.gguf"


def test_app_is_json_only_with_late_acks():
    settings = Settings(database_url="sqlite://", model="tiny-random", visibility_timeout=7200)
    app = create_app(settings)
    c = app.conf
    assert c.task_serializer == "json" and c.accept_content == ["json"]
    assert c.task_acks_late and c.task_reject_on_worker_lost
    assert c.worker_prefetch_multiplier == 1
    assert c.broker_transport_options["visibility_timeout"] == 7200
    assert c.task_default_queue == "applespec.tiny-random"
    assert c.worker_soft_shutdown_timeout > 0
    assert TASK_NAME in app.tasks


@pytest.fixture
def fake_broker(monkeypatch):
    server = fakeredis.FakeServer()
    monkeypatch.setattr(
        enqueue_mod.redis.Redis,
        "from_url",
        classmethod(lambda cls, url, **kw: fakeredis.FakeRedis(server=server)),
    )
    return server


def test_sweep_requeues_jobs_of_a_lost_broker_once(tmp_path, fake_broker):
    url = f"sqlite:///{tmp_path / 's.db'}"
    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    settings = Settings(database_url=url, broker_url="memory://", model="tiny-random")
    app = create_app(settings)
    sent = []
    app.send_task = lambda name, args, queue, producer: sent.append((name, args, queue))
    epoch = enqueue_mod.broker_epoch(settings.broker_url)
    lines = [f'{{"custom_id": "c{i}", "prompt": "p"}}' for i in range(5)]
    with sessions() as s:
        requests, errors = parse_job(lines)
        job = repo.create_job(
            s, model="tiny-random", requests=requests, errors=errors, queue="applespec.q"
        )
        repo.mark_in_progress(s, job.id, broker_epoch=epoch)
        s.commit()
        first = repo.open_item_ids(s, job.id)
        repo.finish_item(  # one item done before the broker was lost
            s,
            repo.start_item(s, first[0], 3),
            {
                "choices": [{"finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
            {"attempt": 1, "worker_host": "h", "completion_tokens": 1},
        )
    assert sweep(app, sessions) == []  # same broker: nothing to do
    enqueue_mod.redis.Redis.from_url("x").flushall()  # the broker restarted empty
    assert sweep(app, sessions) == [job.id]
    assert sorted(i for _, (_, chunk), _ in sent for i in chunk) == first[1:]
    assert {(name, queue) for name, _, queue in sent} == {(TASK_NAME, "applespec.q")}
    assert sweep(app, sessions) == []  # the job now belongs to the new epoch


def test_database_errors_retry_the_chunk(monkeypatch):
    from sqlalchemy.exc import OperationalError

    from worker import tasks

    calls = []

    def flaky(settings, job_id, item_ids, app=None):
        calls.append((settings.database_url, job_id, item_ids))
        if len(calls) < 3:
            raise OperationalError("UPDATE items", {}, Exception("database is locked"))
        return {"completed": len(item_ids), "failed": 0, "skipped": 0}

    monkeypatch.setattr(tasks, "run_chunk", flaky)
    create_app(Settings(database_url="sqlite:///other.db", broker_url="memory://"))
    app = create_app(Settings(database_url="sqlite:///this.db", broker_url="memory://"))
    app.conf.task_always_eager = True
    result = app.tasks[TASK_NAME].apply(args=["batch_x", [1, 2]])
    assert result.get() == {"completed": 2, "failed": 0, "skipped": 0}
    # Retried with backoff, and always with this app's settings (not an earlier app's).
    assert calls == [("sqlite:///this.db", "batch_x", [1, 2])] * 3


def test_a_job_row_naming_a_drafter_path_fails_on_the_worker_without_loading(tmp_path):
    """Defence in depth: a job stored by an older client with `draft-model:/path` fails
    per item with the policy's message; nothing is opened."""
    from worker.process import start_item, store_error
    from worker.tasks import _engine_key

    url = f"sqlite:///{tmp_path / 'd.db'}"
    upgrade(url)
    sessions = make_sessionmaker(make_engine(url))
    settings = Settings(database_url=url, broker_url="memory://", model="tiny-random")
    with sessions() as s:
        requests, errors = parse_job(['{"custom_id": "a", "prompt": "p"}'])
        job = repo.create_job(
            s,
            model="tiny-random",
            drafter="draft-model:/etc/passwd",
            requests=requests,
            errors=errors,
        )
        repo.mark_in_progress(s, job.id)
        s.commit()
        (item_id,) = repo.open_item_ids(s, job.id)
        started = start_item(s, item_id, max_attempts=3, worker_host="w:1")
        with pytest.raises(Exception) as e:
            _engine_key(settings, started)
        outcome = store_error(s, started, e.value)
    assert outcome.error["code"] == "invalid_drafter"
    assert "DraftNotAllowed: --draft draft-model:/etc/passwd: a path" in outcome.error["message"]
