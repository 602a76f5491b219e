"""A farm that survives the night: real Redis, real `applespec worker` processes.

A worker SIGKILLed whole (default settings), a chunk delivered twice while its items run, a
warm shutdown mid-chunk, the SQLite file deleted under a running worker.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
import redis

from migrations import upgrade
from worker.app import queue_name

from .service import (
    ROOT,
    SHARED_REDIS,
    Store,
    Worker,
    service_env,
    submit,
    unique_model,
    write_prompts,
)

pytestmark = [pytest.mark.service, pytest.mark.slow]

CHUNK_LINE = re.compile(r"chunk of (\d+): (\{[^}]*\})")


def _chunks(*logs) -> list[dict[str, int]]:
    """The outcome counts of every chunk the workers logged."""
    import ast

    return [
        ast.literal_eval(m.group(2)) for log in logs for m in CHUNK_LINE.finditer(log.read_text())
    ]


def _owner_pid(item) -> int:
    return int(item.worker.rsplit(":", 1)[1])


def _pids(worker: Worker) -> set[int]:
    """A live worker's main and pool process ids (kept to recognise them after it exits)."""
    return {int(p) for p in os.listdir("/proc") if p.isdigit() and worker.owns(int(p))}


@pytest.mark.slow
def test_sigkilled_worker_with_default_settings_loses_nothing_and_runs_nothing_twice(tmp_path):
    """Default visibility timeout (1 h), lease, heartbeat and sweep interval: the dead worker's
    chunk comes back through its expired leases, well within 2 minutes of the kill."""
    db = f"sqlite:///{tmp_path / 'crash.db'}"
    # A job larger than a batch: each worker runs 4 rows at a time.
    env = service_env(db, APPLESPEC_BATCH_SIZE="4")
    for name in ("APPLESPEC_SWEEP_INTERVAL", "APPLESPEC_CHUNK_SIZE"):
        env.pop(name)  # the defaults: sweep every 10 s, chunks of 8
    upgrade(db)
    model = unique_model()
    store = Store(db)
    a = Worker(env, model, tmp_path / "a.log", item_delay=0.3)
    b = Worker(env, model, tmp_path / "b.log", item_delay=0.3)
    try:
        a.wait_ready()
        b.wait_ready()
        path = write_prompts(tmp_path / "job.jsonl", [f"r{i:02d}" for i in range(24)], 8)
        job_id = submit(env, path, model)

        def running_on_a():
            return [
                i for i in store.items(job_id) if i.status == "running" and a.owns(_owner_pid(i))
            ]

        store.wait_for(running_on_a, 90, "an item running on worker A")
        pids = _pids(a)
        a.kill()
        killed = time.monotonic()
        held = [
            i
            for i in store.items(job_id)
            if i.lease_owner and int(i.lease_owner.rsplit(":", 1)[1]) in pids
        ]
        assert held, "worker A held no lease when it was killed"
        store.wait_for(
            lambda: store.job(job_id).status == "completed", 120, "the job to complete", job=job_id
        )
        recovery = time.monotonic() - killed
        print(
            f"\nrecovery after SIGKILL with default settings: {recovery:.1f} s "
            f"({len(held)} items held by the killed worker)"
        )
        assert recovery < 120
        items = store.items(job_id)
        assert all(i.status == "completed" and i.lease_owner is None for i in items)
        per_item = store.results_per_item(job_id)
        assert sorted(per_item) == sorted(i.id for i in items)
        assert set(per_item.values()) == {1}  # every item exactly once
        metrics = store.metrics(job_id)
        assert all(metrics[i.id].attempt == i.attempts >= 1 for i in items)
        by_id = {i.id: i for i in items}
        for h in held:  # finished by B; the one A was running counts two starts
            assert _owner_pid(by_id[h.id]) not in pids
            assert by_id[h.id].attempts == h.attempts + 1
        assert "whose worker stopped beating queued again" in (tmp_path / "b.log").read_text()
    finally:
        a.stop()
        b.stop()
        store.dispose()


# A consumer that takes one chunk from the broker the way a worker does (unacknowledged) and
# holds it until it is killed: a worker SIGKILLed between receiving a chunk and leasing it.
TAKE_ONE = """
import sys
from worker.app import create_app
with create_app().connection_for_read() as conn:
    message = conn.default_channel.basic_get(sys.argv[1])
    print("taken" if message is not None else "empty", flush=True)
    sys.stdin.read()
"""


@pytest.mark.slow
def test_a_chunk_whose_worker_died_before_leasing_it_is_queued_again(tmp_path):
    """Redis keeps a delivered chunk unacknowledged for the visibility timeout (an hour): a
    worker that dies after receiving it and before leasing its items would leave them pending
    that long. The sweeper of a live worker puts it back once it is a lease old."""
    db = f"sqlite:///{tmp_path / 'taken.db'}"
    env = service_env(
        db, APPLESPEC_LEASE_TIMEOUT="2", APPLESPEC_HEARTBEAT_INTERVAL="0.5"
    )  # the default visibility timeout
    upgrade(db)
    model = unique_model()
    store = Store(db)
    path = write_prompts(tmp_path / "job.jsonl", [f"t{i}" for i in range(4)], 4)
    job_id = submit(env, path, model)  # two chunks of two, no worker yet
    taker = subprocess.Popen(
        [sys.executable, "-c", TAKE_ONE, queue_name(model)],
        cwd=ROOT,
        env={**os.environ, **env, "APPLESPEC_MODEL": model},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    b = None
    try:
        assert taker.stdout.readline().strip() == "taken"
        taker.kill()
        taker.wait(timeout=10)
        b = Worker(env, model, tmp_path / "b.log")
        b.wait_ready()
        store.wait_for(
            lambda: store.job(job_id).status == "completed", 60, "the job to complete", job=job_id
        )
        items = store.items(job_id)
        assert [i.attempts for i in items] == [1, 1, 1, 1]
        assert set(store.results_per_item(job_id).values()) == {1}
        assert sorted(store.results_per_item(job_id)) == [i.id for i in items]
        log = b.log.read_text()
        assert f"job {job_id}: 2 item(s) whose worker died as it received them queued again" in log
    finally:
        if taker.poll() is None:
            taker.kill()
        if b is not None:
            b.stop()
        store.dispose()


@pytest.mark.slow
def test_a_chunk_delivered_again_while_its_items_run_is_not_run_twice(tmp_path):
    """A worker acknowledges a chunk once it has leased its items and handed them to its
    engine; a second delivery of the same chunk (the broker's visibility timeout, or a
    sweep racing a live worker) reaches the second worker while the first still runs the
    items: their leases are live, so it skips them all."""
    from core.settings import Settings
    from core.store.database import make_engine, make_sessionmaker
    from worker.app import create_app
    from worker.enqueue import enqueue

    db = f"sqlite:///{tmp_path / 'slow.db'}"
    env = service_env(
        db,
        APPLESPEC_VISIBILITY_TIMEOUT="3",
        APPLESPEC_LEASE_TIMEOUT="4",
        APPLESPEC_HEARTBEAT_INTERVAL="0.5",
    )
    upgrade(db)
    model = unique_model()
    store = Store(db)
    a = Worker(env, model, tmp_path / "a.log", item_delay=1.5)
    b = Worker(env, model, tmp_path / "b.log", item_delay=1.5)
    try:
        a.wait_ready()
        b.wait_ready()
        path = write_prompts(tmp_path / "job.jsonl", [f"s{i}" for i in range(4)], 4)
        job_id = submit(env, path, model, "--chunk-size", "4")  # one chunk, >= 6 s
        store.wait_for(
            lambda: any(i.status == "running" for i in store.items(job_id)), 60, "a start"
        )
        settings = Settings.from_env({**os.environ, **env, "APPLESPEC_MODEL": model})
        with make_sessionmaker(make_engine(db))() as s:
            ids = [i.id for i in store.items(job_id)]
            enqueue(create_app(settings), s, job_id, ids, 4)  # the same chunk, again
        store.wait_for(lambda: store.job(job_id).status == "completed", 90, "the job to complete")
        items = store.items(job_id)
        assert [i.attempts for i in items] == [1, 1, 1, 1]  # nothing started twice
        assert set(store.results_per_item(job_id).values()) == {1}
        assert len({m.worker_host for m in store.metrics(job_id).values()}) == 1
        chunks = _chunks(tmp_path / "a.log", tmp_path / "b.log")
        # Both deliveries arrived; the second skipped every item.
        assert {"submitted": 0, "failed": 0, "skipped": 4, "handed_back": 0} in chunks
        assert sum(c["submitted"] for c in chunks) == 4
    finally:
        a.stop()
        b.stop()
        store.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("target", ["main", "group"])
def test_warm_shutdown_finishes_the_rows_in_progress_and_hands_the_rest_back(tmp_path, target):
    """SIGTERM to a worker's main process (`kill PID`) or to its whole process group
    (systemd's default): the rows it is generating finish, the items still waiting in its
    engine go back to the queue, and the other worker runs them."""
    db = f"sqlite:///{tmp_path / 'warm.db'}"
    # Two rows at a time, each item slow to start: most of the chunk waits in the engine.
    env = service_env(db, APPLESPEC_BATCH_SIZE="2")
    upgrade(db)
    model = unique_model()
    store = Store(db)
    workers = [Worker(env, model, tmp_path / f"w{i}.log", item_delay=0.4) for i in range(2)]
    try:
        for w in workers:
            w.wait_ready()
        path = write_prompts(tmp_path / "job.jsonl", [f"w{i:02d}" for i in range(12)], 4)
        job_id = submit(env, path, model, "--chunk-size", "12")  # one chunk: one worker takes it
        store.wait_for(lambda: store.job(job_id).completed >= 2, 60, "two completed items")
        first = next(i for i in store.items(job_id) if i.status == "completed")
        a, b = workers if workers[0].owns(_owner_pid(first)) else workers[::-1]
        a_pids, b_pids = _pids(a), _pids(b)
        if target == "main":
            os.kill(a.pid, signal.SIGTERM)
        else:
            os.killpg(a.pid, signal.SIGTERM)
        stopping = time.monotonic()
        a.proc.wait(timeout=20)
        stopped_in = time.monotonic() - stopping
        assert stopped_in < 8, f"warm shutdown took {stopped_in:.1f} s"
        # Handed back: what the chunk had not given its engine yet, and what waited there.
        log = a.log.read_text()
        handed = sum(c["handed_back"] for c in _chunks(a.log))
        handed += sum(int(n) for n in re.findall(r"handed (\d+) queued item", log))
        assert "queued item(s) back on shutdown" in log  # the pool process's exit hook ran
        assert 0 < handed < 12
        store.wait_for(lambda: store.job(job_id).status == "completed", 60, "the job to complete")
        items = store.items(job_id)
        assert [i.attempts for i in items] == [1] * 12  # handed back before they started
        assert set(store.results_per_item(job_id).values()) == {1}
        pids = [int(m.worker_host.rsplit(":", 1)[1]) for m in store.metrics(job_id).values()]
        assert sum(p in a_pids for p in pids) == 12 - handed >= 2
        assert sum(p in b_pids for p in pids) == handed
    finally:
        for w in workers:
            w.stop()
        store.dispose()


@pytest.mark.slow
def test_a_deleted_sqlite_database_stops_the_worker_instead_of_writing_into_it(tmp_path):
    db_path = tmp_path / "gone.db"
    db = f"sqlite:///{db_path}"
    env = service_env(db)
    upgrade(db)
    model = unique_model()
    store = Store(db)
    a = Worker(env, model, tmp_path / "a.log", item_delay=0.5)
    broker = redis.Redis.from_url(SHARED_REDIS)
    try:
        a.wait_ready()
        path = write_prompts(tmp_path / "job.jsonl", [f"d{i:02d}" for i in range(10)], 4)
        job_id = submit(env, path, model, "--chunk-size", "10")
        store.wait_for(lambda: store.job(job_id).completed >= 2, 60, "two completed items")
        store.dispose()
        for suffix in ("", "-wal", "-shm"):
            (tmp_path / f"gone.db{suffix}").unlink(missing_ok=True)
        a.proc.wait(timeout=30)  # the worker stops by itself
        log = (tmp_path / "a.log").read_text()
        assert f"the SQLite database {db_path} was deleted or moved" in log
        assert "stopping this worker" in log
        assert not db_path.exists()  # nothing was written into a new, empty database
    finally:
        a.stop()
        broker.delete(queue_name(model))
        broker.close()
