"""Putting a job's items on its model's queue, in chunks, and knowing which broker holds them."""

from __future__ import annotations

import uuid

import redis
from celery import Celery
from sqlalchemy import update
from sqlalchemy.orm import Session

from core.store import repo
from core.store.models import Item, Job, utcnow

from .app import TASK_NAME

# A random id stored in the broker. Redis without persistence loses it (and every queued
# chunk) on restart; a job enqueued under another epoch must then be enqueued again.
EPOCH_KEY = "applespec:broker-epoch"


def broker_epoch(broker_url: str) -> str:
    """The broker's current epoch, created when missing."""
    client = redis.Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
        return client.get(EPOCH_KEY).decode()
    finally:
        client.close()


def enqueue(
    app: Celery, session: Session, job_id: str, item_ids: list[int], chunk_size: int
) -> int:
    """Send `item_ids` as chunks of `chunk_size` to the job's queue; commits first.

    Returns:
        The number of chunks sent.
    """
    job = repo.get_job(session, job_id)
    chunks = [item_ids[i : i + chunk_size] for i in range(0, len(item_ids), chunk_size)]
    now = utcnow()
    for i in range(0, len(item_ids), 500):  # bounded IN lists (SQLite caps bound parameters)
        batch = item_ids[i : i + 500]
        session.execute(
            update(Item).where(Item.id.in_(batch)).values(queued_at=now),
            execution_options={"synchronize_session": False},
        )
    queue = job.queue
    session.commit()
    with app.producer_or_acquire() as producer:
        for chunk in chunks:
            app.send_task(TASK_NAME, args=[job_id, chunk], queue=queue, producer=producer)
    return len(chunks)


def hand_back(
    app: Celery, session: Session, job_id: str, item_ids: list[int], worker: str, chunk_size: int
) -> int:
    """Release `worker`'s leases on `item_ids` and queue them again (a warm shutdown's rest
    of a chunk); returns how many went back.

    Released first, then sent: a chunk delivered before the release would skip them as
    leased. If the broker cannot take them, the job is marked as of an unknown broker epoch
    and the sweeper of a live worker queues its open items once the broker answers.
    """
    released = repo.release_items(session, item_ids, worker)
    if not released:
        return 0
    try:
        enqueue(app, session, job_id, released, chunk_size)
    except Exception:
        session.rollback()
        session.execute(update(Job).where(Job.id == job_id).values(broker_epoch=None))
        session.commit()
        raise
    return len(released)
