"""Leases in the store: reserve, claim, renew, release, reap; cancel and retry with dead
workers; worker presence; idempotency keys; text both stores can hold."""

import json

import pytest
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from core.jobs import parse_job
from core.store import repo
from core.store.models import Item, Job

A, B = "host-a:101", "host-b:202"
BODY = {
    "choices": [{"finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
METRIC = {"attempt": 1, "worker_host": A, "completion_tokens": 1}


def _job(session, n=4, **kw):
    lines = [json.dumps({"custom_id": f"c{i}", "prompt": "p"}) for i in range(n)]
    requests, errors = parse_job(lines)
    job = repo.create_job(session, model="m", requests=requests, errors=errors, queue="q", **kw)
    repo.mark_in_progress(session, job.id, broker_epoch="e")
    session.commit()
    return job, repo.open_item_ids(session, job.id)


def _item(session, item_id):
    session.expire_all()
    return session.get(Item, item_id)


def test_a_chunk_is_leased_whole_and_a_live_lease_is_skipped(sessions):
    with sessions() as s:
        job, ids = _job(s)
        other, other_ids = _job(s, n=1)
        assert repo.lease_items(s, job.id, [*ids[:2], other_ids[0]], A, 30) == ids[:2]
        # The chunk redelivered to B while A lives: B gets only what A does not hold.
        assert repo.lease_items(s, job.id, ids, B, 30) == ids[2:]
        assert repo.claim_item(s, ids[0], B, 30, max_attempts=3) is None
        item = repo.claim_item(s, ids[0], A, 30, max_attempts=3)
        assert item.status == "running" and item.lease_owner == A and item.attempts == 1
        # A's own redelivery (a retried task) takes its items again.
        assert repo.lease_items(s, job.id, ids[:2], A, 30) == ids[:2]
        repo.finish_item(s, item, BODY, dict(METRIC))
        done = _item(s, ids[0])
        assert done.lease_owner is None and done.lease_expires_at is None
        assert repo.lease_items(s, job.id, ids[:1], B, 30) == []  # done items are skipped


def test_an_expired_or_dead_owners_lease_is_taken_over(sessions):
    with sessions() as s:
        job, ids = _job(s, n=2)
        repo.lease_items(s, job.id, ids[:1], A, -1)  # already expired
        repo.lease_items(s, job.id, ids[1:], A, 30)
        assert repo.lease_items(s, job.id, ids, B, 30) == ids[:1]
        assert repo.lease_items(s, job.id, ids, B, 30, owner_dead=lambda o: o == A) == ids
        assert repo.claim_item(s, ids[1], B, 30, 3, owner_dead=lambda o: o == A).attempts == 1


def test_renew_extends_only_the_owners_open_leases(sessions):
    with sessions() as s:
        job, ids = _job(s, n=3)
        repo.lease_items(s, job.id, ids[:2], A, 1)
        repo.lease_items(s, job.id, ids[2:], B, 1)
        before = repo.aware(_item(s, ids[0]).lease_expires_at)
        assert repo.renew_leases(s, A, ids, 60) == set(ids[:2])
        assert (repo.aware(_item(s, ids[0]).lease_expires_at) - before).total_seconds() > 50
        repo.finish_item(s, repo.claim_item(s, ids[0], A, 60, 3), BODY, dict(METRIC))
        assert repo.renew_leases(s, A, ids, 60) == {ids[1]}  # finished: the lease is gone


def test_release_hands_items_back_with_their_attempt(sessions):
    with sessions() as s:
        job, ids = _job(s, n=3)
        repo.lease_items(s, job.id, ids, A, 30)
        repo.claim_item(s, ids[0], A, 30, 3)
        assert repo.release_items(s, [*ids, 999_999], B) == []  # not B's
        assert repo.release_items(s, ids, A) == ids
        for item_id in ids:
            item = _item(s, item_id)
            assert (item.status, item.lease_owner, item.attempts) == ("pending", None, 0)
        assert repo.lease_items(s, job.id, ids, B, 30) == ids


def test_reap_requeues_expired_items_once_and_cancels_a_cancelling_jobs(sessions):
    with sessions() as s:
        job, ids = _job(s, n=4)
        repo.lease_items(s, job.id, ids[:3], A, -1)  # A died holding three items
        repo.claim_item(s, ids[0], A, -1, 3)
        repo.lease_items(s, job.id, ids[3:], B, 30)  # B is alive
        assert [i for _, i in repo.expired_items(s)] == ids[:3]
        assert repo.reap_expired(s) == {job.id: ids[:3]}
        assert repo.reap_expired(s) == {}  # taken back once, by one sweeper
        item = _item(s, ids[0])
        assert (item.status, item.lease_owner, item.attempts) == ("pending", None, 1)
        assert _item(s, ids[3]).lease_owner == B
        # A cancelling job whose running item's worker died ends cancelled.
        other, (x,) = _job(s, n=1)
        repo.claim_item(s, x, A, -1, 3)
        assert repo.cancel_job(s, other.id).status == "cancelled"  # expired: cancelled now
        third, (y,) = _job(s, n=1)
        repo.claim_item(s, y, A, 0.5, 3)
        assert repo.cancel_job(s, third.id).status == "cancelling"  # A may still finish it
        s.execute(
            Item.__table__.update()
            .where(Item.id == y)
            .values(lease_expires_at=repo.lease_until(-1))
        )
        s.commit()
        assert repo.reap_expired(s) == {}
        s.expire_all()
        assert repo.get_job(s, third.id).status == "cancelled"
        assert _item(s, y).error_message == "cancelled; its worker had stopped"


def test_never_leased_finds_a_deliverys_items_nobody_took_since(sessions):
    from datetime import timedelta

    with sessions() as s:
        job, ids = _job(s, n=5)
        other, other_ids = _job(s, n=1)
        delivered = repo.utcnow()
        repo.lease_items(s, job.id, ids[:1], A, 30)  # leased: held by a worker
        repo.lease_items(s, job.id, ids[1:2], A, -1)  # leased, expired: the reaper's to take
        finished = repo.claim_item(s, ids[2], B, 30, 3)
        repo.finish_item(s, finished, BODY, dict(METRIC))
        later = delivered + timedelta(seconds=5)  # queued again after the delivery
        s.execute(Item.__table__.update().where(Item.id == ids[3]).values(queued_at=later))
        s.execute(Item.__table__.update().where(Item.id == ids[4]).values(queued_at=delivered))
        s.commit()
        chunk = [*ids, other_ids[0]]
        assert repo.never_leased(s, job.id, chunk, delivered) == [ids[4]]
        assert repo.never_leased(s, job.id, chunk, later) == ids[3:]
        assert repo.never_leased(s, other.id, other_ids, delivered) == other_ids  # never queued


def test_retry_requeues_running_items_whose_lease_expired(sessions):
    with sessions() as s:
        job, ids = _job(s, n=3)
        repo.claim_item(s, ids[0], A, -1, 3)  # its worker died
        repo.claim_item(s, ids[1], B, 30, 3)  # its worker lives
        assert repo.retry_job(s, job.id) == [ids[0]]
        item = _item(s, ids[0])
        assert (item.status, item.lease_owner) == ("pending", None)
        assert _item(s, ids[1]).status == "running"


def test_worker_presence_per_queue(sessions):
    with sessions() as s:
        assert repo.queue_consumers(s, "q1") == (0, None)
        repo.worker_seen(s, A, ["q1", "q2"], ttl_s=30)
        repo.worker_seen(s, B, ["q2"], ttl_s=30)
        repo.worker_seen(s, A, ["q1", "q2"], ttl_s=30)  # refreshed, not duplicated
        live, last = repo.queue_consumers(s, "q1")
        assert live == 1 and last is not None
        assert repo.queue_consumers(s, "q2")[0] == 2
        repo.worker_gone(s, A)
        assert repo.queue_consumers(s, "q1")[0] == 0
        assert repo.queue_consumers(s, "q1")[1] == last  # still says when it was last seen


def test_an_idempotency_key_names_one_job(sessions):
    with sessions() as s:
        job, _ = _job(s, n=1, idempotency_key="k1", submission_hash="h")
        assert repo.find_job(s, "k1").id == job.id
        _job(s, n=1)  # jobs without a key do not collide
        _job(s, n=1)
        with pytest.raises(IntegrityError):
            _job(s, n=1, idempotency_key="k1")
        s.rollback()
        assert len(s.scalars(select(Job).where(Job.idempotency_key == "k1")).all()) == 1


def test_text_either_store_can_hold(sessions):
    with sessions() as s:
        requests, errors = parse_job(["{bad"])
        errors[0].message += " \x00 \ud800"
        job = repo.create_job(
            s,
            model="m",
            requests=requests,
            errors=errors,
            input_file="/data/\udcff" + "x" * 2000,
        )
        s.commit()
        (item_id,) = repo.open_item_ids(s, job.id, ("invalid",))
        assert _item(s, item_id).error_message.endswith(" \\x00 \\ud800")
        assert len(repo.get_job(s, job.id).input_file) == 1024
        ok, _ = parse_job([json.dumps({"custom_id": "a", "prompt": "p"})])
        job2 = repo.create_job(s, model="m", requests=ok, errors=[])
        (a,) = repo.open_item_ids(s, job2.id)
        repo.claim_item(s, a, A, 30, 3)
        repo.fail_item(s, a, "engine_error", "line 1: RuntimeError: \x00 in output")
        assert _item(s, a).error_message == "line 1: RuntimeError: \\x00 in output"


def test_a_worker_reads_the_answers_others_stored_since_it_last_looked(sessions):
    def body(text, url="chat"):
        choice = {"text": text} if url == "completions" else {"message": {"content": text}}
        return {**BODY, "choices": [{**choice, "finish_reason": "stop"}]}

    with sessions() as s:
        job, ids = _job(s, n=4)
        for item_id, worker, text in [(ids[0], A, "from a"), (ids[1], B, '{"label": "b1"}')]:
            item = repo.claim_item(s, item_id, worker, 30, max_attempts=3)
            repo.finish_item(s, item, body(text), {**METRIC, "worker_host": worker})
        s.commit()
        texts, last, done = repo.answers_since(s, job.id, 0, not_worker=A)
        assert texts == ['{"label": "b1"}'] and not done
        assert repo.answers_since(s, job.id, 0)[0] == ["from a", '{"label": "b1"}']
        # incremental: only what was stored after the last result seen
        item = repo.claim_item(s, ids[2], B, 30, max_attempts=3)
        repo.finish_item(s, item, body("b2", "completions"), {**METRIC, "worker_host": B})
        s.commit()
        texts, last2, _ = repo.answers_since(s, job.id, last, not_worker=A)
        assert texts == ["b2"] and last2 > last
        assert repo.answers_since(s, job.id, last2, not_worker=A)[:2] == ([], last2)
        # bounded: the newest `limit` answers only
        assert repo.answers_since(s, job.id, 0, limit=1)[0] == ["b2"]
        item = repo.claim_item(s, ids[3], A, 30, max_attempts=3)
        repo.finish_item(s, item, body("a2"), dict(METRIC))
        s.commit()
        assert repo.answers_since(s, job.id, last2, not_worker=A)[2]  # the job is done
