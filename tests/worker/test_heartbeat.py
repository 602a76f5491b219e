"""The heartbeat thread keeps a process's leases alive, notices lost ones, and stops on a
vanished SQLite file; the warm-shutdown flag of a pool process."""

import json
import os
import signal
import time

import pytest

from core.jobs import parse_job
from core.store import repo
from core.store.database import make_engine, make_sessionmaker
from core.store.models import Item
from migrations import upgrade
from worker import shutdown
from worker.heartbeat import Heartbeat

ME, OTHER = "me:1", "other:2"


@pytest.fixture
def store(tmp_path):
    url = f"sqlite:///{tmp_path / 'hb.db'}"
    upgrade(url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    with sessions() as s:
        lines = [json.dumps({"custom_id": f"c{i}", "prompt": "p"}) for i in range(3)]
        requests, errors = parse_job(lines)
        job = repo.create_job(s, model="m", requests=requests, errors=errors)
        repo.mark_in_progress(s, job.id)
        s.commit()
        ids = repo.open_item_ids(s, job.id)
        repo.lease_items(s, job.id, ids, ME, 1.0)
    yield sessions, ids, tmp_path / "hb.db"
    engine.dispose()


def _expiry(sessions, item_id):
    with sessions() as s:
        return repo.aware(s.get(Item, item_id).lease_expires_at)


@pytest.mark.slow
def test_the_thread_keeps_held_leases_alive_and_lets_dropped_ones_expire(store):
    sessions, ids, _ = store
    beat = Heartbeat(sessions, ME, lease_s=1.0, interval=0.1)
    assert beat.hold(ids) == ids
    assert beat.hold([ids[0], 999]) == [999]  # already held: not again
    beat.drop([999, ids[2]])
    time.sleep(1.5)  # past the first lease: only the beats keep it
    with sessions() as s:
        expired = {i for _, i in repo.expired_items(s)}
    assert ids[0] not in expired and ids[1] not in expired
    assert ids[2] in expired
    beat.stop()


def test_a_lease_taken_over_is_reported_and_dropped(store):
    sessions, ids, _ = store
    beat = Heartbeat(sessions, ME, lease_s=5.0, interval=60)
    beat.hold(ids)
    with sessions() as s:  # our lease ran out and another worker took the first item
        s.execute(Item.__table__.update().where(Item.id == ids[0]).values(lease_owner=OTHER))
        s.commit()
    assert beat.beat() == {ids[0]}
    assert beat.held() == ids[1:]
    assert (_expiry(sessions, ids[1]) - repo.utcnow()).total_seconds() > 4


def test_a_vanished_database_stops_the_heartbeat(store):
    sessions, ids, path = store
    gone = []
    beat = Heartbeat(sessions, ME, lease_s=1.0, interval=0.05, on_store_gone=gone.append)
    beat.hold(ids)
    path.unlink()
    deadline = time.monotonic() + 5
    while not gone and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone and "was deleted or moved" in str(gone[0])
    beat.stop()


def test_a_pool_process_takes_sigusr2_or_a_first_sigterm_as_the_stop_request():
    old = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR2)
    try:
        shutdown._in_pool_process()
        shutdown._armed_in = None
        shutdown._before_task()
        assert not shutdown.requested()
        os.kill(os.getpid(), signal.SIGTERM)  # the first SIGTERM: finish, hand back
        time.sleep(0.05)
        assert shutdown.requested()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the next one stops at once
        shutdown._in_pool_process()
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        assert shutdown.requested()
    finally:
        signal.signal(signal.SIGTERM, old[0])
        signal.signal(signal.SIGUSR2, old[1])
        shutdown._requested.clear()
