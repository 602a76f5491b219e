"""A Python client for the batch service, for labeling pipelines.

    from api.client import Client

    client = Client()                       # settings from APPLESPEC_* (store, broker)
    job = client.submit(
        [{"custom_id": "q1", "prompt": "Label: great movie ->"}],
        model="smollm2-135m", max_tokens=8,
    )
    client.wait(job["id"], progress=True)
    for line in client.results(job["id"]):  # OpenAI Batch output lines, in input order
        print(line["custom_id"], line["response"] and line["response"]["body"]["choices"])

`applespec submit` is this client's `submit` behind a command line.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from core.jobs import LineError, LongLine, iter_job_file, tokenizer_target, validate_for
from core.settings import Settings, mask_url


class BrokerUnavailable(RuntimeError):
    """The broker (Redis) could not be reached to queue a job."""


class IdempotencyConflict(ValueError):
    """An idempotency key already names a job submitted with other lines or options."""


class NoWorkerWarning(UserWarning):
    """`Client.wait`: no live worker has consumed the job's queue for a while."""


NAME_MAX = 255  # the store's width for model, drafter and idempotency key


class JobTimeout(TimeoutError):
    """`wait` ran out of time before the job finished."""


def open_sessions(url: str, readonly: bool = False):
    """A sessionmaker for `url`, migrated to the latest schema first (idempotent)."""
    from core.store.database import make_engine, make_sessionmaker
    from migrations import upgrade

    upgrade(url)
    return make_sessionmaker(make_engine(url), readonly=readonly)


def submit_lines(
    settings: Settings,
    lines: Iterable[str | bytes | LongLine],
    *,
    model: str,
    draft: str = "auto",
    k: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    chunk_size: int | None = None,
    input_file: str | None = None,
    sessions=None,
    idempotency_key: str | None = None,
    target=None,
    on_create: Callable[[Any, Any], None] | None = None,
) -> tuple[dict[str, Any], list[LineError]]:
    """Validate job lines, store the job and queue its valid items in chunks.

    Lines are validated with the model's tokenizer alone (no weights) and streamed: `lines`
    may be a generator (`core.jobs.iter_job_file`), text or raw bytes per line. `model` may be
    an APPLESPEC_MODEL_ALIASES name. With `idempotency_key`, a key already used returns that
    job (nothing new is stored or queued), provided the lines and options are the same.
    `target` is the caller's tokenizer target when it keeps one; `on_create(session, job)`
    runs once the job is stored, in the same transaction (the HTTP API attaches its batch
    row there).

    Returns:
        The job summary (`applespec status --json`, plus queue, chunks, queued and, for a
        repeated key, replayed=True) and the bad lines.

    Raises:
        ModelError: the model's tokenizer cannot be loaded.
        DraftNotAllowed: `draft` names a path or an unknown model (core.draft_policy).
        JobTooLarge: the lines are more than APPLESPEC_MAX_LINES requests.
        IdempotencyConflict: the key names a job submitted differently.
        ValueError: no requests at all (blank lines only), a bad override or chunk size, or
            a name too long for the store.
        BrokerUnavailable: Redis is down; when the job was already stored, a worker's sweep
            queues it once the broker is back.
    """
    from sqlalchemy.exc import IntegrityError

    from core.draft_policy import resolve_draft
    from core.store import repo
    from worker.app import create_app, queue_name
    from worker.enqueue import broker_epoch, enqueue

    model = settings.resolve_model(model)
    _check_name("model", model)
    _check_name("drafter", draft)
    if idempotency_key is not None:
        _check_name("idempotency key", idempotency_key)
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk size must be a whole number >= 1, got {chunk_size!r}")
    resolve_draft(draft, settings)
    sessions = sessions or open_sessions(settings.database_url)
    digest = hashlib.sha256(
        json.dumps([model, draft, k, sorted((overrides or {}).items())], default=str).encode()
    )
    hashed = _hashing(lines, digest)
    if idempotency_key is not None:
        with sessions() as s:
            existing = repo.find_job(s, idempotency_key)
            if existing is not None:
                for _ in hashed:  # the whole submission, to compare it
                    pass
                return _replay(s, existing, idempotency_key, digest.hexdigest())
    target = target or _tokenizer_target(model)
    requests, bad = validate_for(
        hashed,
        model,
        target,
        overrides,
        limits=settings.job_limits(),
        aliases=settings.model_aliases,
        strict_models=settings.strict_models,
    )
    if not requests and not bad:
        raise ValueError(f"{input_file or 'the input'} has no requests")
    try:
        epoch = broker_epoch(settings.broker_url)
    except Exception as e:
        raise BrokerUnavailable(broker_message(settings, e)) from e
    with sessions() as s:
        try:
            job = repo.create_job(
                s,
                model=model,
                drafter=draft,
                k=k,
                params=dict(overrides or {}),
                mode="service",
                input_file=input_file,
                queue=queue_name(model),
                requests=requests,
                errors=bad,
                idempotency_key=idempotency_key,
                submission_hash=digest.hexdigest() if idempotency_key is not None else None,
            )
        except IntegrityError:
            if idempotency_key is None:
                raise
            s.rollback()  # a concurrent submit with the same key won
            return _replay(
                s, repo.find_job(s, idempotency_key), idempotency_key, digest.hexdigest()
            )
        if on_create is not None:
            on_create(s, job)
        repo.mark_in_progress(s, job.id, broker_epoch=epoch)
        s.commit()
        ids = repo.open_item_ids(s, job.id)
        try:
            chunks = enqueue(
                create_app(settings), s, job.id, ids, chunk_size or settings.chunk_size
            )
        except Exception as e:
            job.broker_epoch = None  # the sweep re-queues jobs of an unknown epoch
            s.commit()
            raise BrokerUnavailable(broker_message(settings, e)) from e
        summary = repo.job_summary(s, job.id)
    summary.update(queue=job.queue, chunks=chunks, queued=len(ids), replayed=False)
    return summary, bad


@functools.lru_cache(maxsize=8)
def requeue(settings: Settings, sessions, job_id: str, chunk_size: int | None = None) -> int:
    """Resume a service job (core.store.repo.retry_job) and queue what it reopened; how
    many requests were queued again.

    Raises:
        UnknownJob: no such job.
        ValueError: the job was run by `applespec run` (run the same command again).
        BrokerUnavailable: Redis is down; the reopened items stay pending and a worker's
            sweep queues them once the broker answers.
    """
    from core.store import batches, repo
    from worker.app import create_app
    from worker.enqueue import broker_epoch, enqueue

    with sessions() as s:
        job = repo.get_job(s, job_id)
        if job.mode != "service":
            raise ValueError(f"{job_id} was run with `applespec run`; run it again")
        try:
            epoch = broker_epoch(settings.broker_url)
        except Exception as e:
            raise BrokerUnavailable(broker_message(settings, e)) from e
        ids = repo.retry_job(s, job_id)
        if ids:
            batches.reopen_outputs(s, job_id)
        job.broker_epoch = epoch
        s.commit()
        try:
            enqueue(create_app(settings), s, job_id, ids, chunk_size or settings.chunk_size)
        except Exception as e:
            job.broker_epoch = None  # a worker's sweep queues them once the broker answers
            s.commit()
            raise BrokerUnavailable(broker_message(settings, e)) from e
    return len(ids)


def _tokenizer_target(model: str):
    return tokenizer_target(model)


def _check_name(what: str, value: str) -> None:
    if not isinstance(value, str) or not value or len(value) > NAME_MAX or "\x00" in value:
        raise ValueError(f"the {what} must be 1 to {NAME_MAX} characters without NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"the {what} is not valid Unicode text") from None


def _hashing(lines: Iterable[str | bytes | LongLine], digest) -> Iterator[str | bytes | LongLine]:
    """`lines` unchanged, each fed to `digest` on the way (an idempotent replay compares it)."""
    for line in lines:
        if isinstance(line, LongLine):
            digest.update(f"<{line.size} bytes>".encode())
        elif isinstance(line, bytes):
            digest.update(line)
        else:
            digest.update(line.encode("utf-8", "surrogatepass"))
        digest.update(b"\n")
        yield line


def _replay(s, job, key: str, submission_hash: str) -> tuple[dict[str, Any], list[LineError]]:
    """The summary and bad lines of the job already submitted under `key`."""
    from core.store import repo

    if job.submission_hash != submission_hash:
        raise IdempotencyConflict(
            f"idempotency key {key!r} was used for job {job.id} with other lines or options; "
            "use a new key for a new job"
        )
    summary = repo.job_summary(s, job.id)
    summary.update(queue=job.queue, chunks=0, queued=0, replayed=True)
    return summary, repo.invalid_lines(s, job.id)


def broker_message(settings: Settings, e: Exception) -> str:
    return settings.redact(
        f"cannot reach the broker at {mask_url(settings.broker_url)} ({type(e).__name__}: {e}); "
        "is Redis running? (APPLESPEC_BROKER_URL)"
    )


class IdleWatch:
    """Notices, once, that no live worker has consumed a job's queue for `idle_warning`
    seconds (workers record their presence every sweep; see worker/sweeper.py)."""

    def __init__(self, settings: Settings, job_id: str):
        self.settings = settings
        self.job_id = job_id
        self.since = time.monotonic()  # no worker seen since (while none is live)
        self.warned = False

    def check(self, session) -> str | None:
        """The warning to show now, or None (at most one warning per watch)."""
        from core.store import repo
        from core.store.models import JOB_DONE, utcnow

        job = repo.get_job(session, self.job_id)
        if self.warned or job.mode != "service" or not job.queue or job.status in JOB_DONE:
            return None
        live, last = repo.queue_consumers(session, job.queue)
        if live:
            self.since = time.monotonic()
            return None
        absent = time.monotonic() - self.since
        if last is not None:
            absent = max(absent, (utcnow() - last).total_seconds())
        if absent < self.settings.idle_warning:
            return None
        self.warned = True
        seen = f"last seen {last:%Y-%m-%d %H:%M:%S} UTC" if last else "none seen yet"
        return (
            f"no worker has consumed queue {job.queue} for {absent:.0f} s ({seen}); "
            f"start one: applespec worker --model {job.model}"
        )


class Client:
    """Submit jobs, wait for them and read their results, from Python."""

    def __init__(self, settings: Settings | None = None):
        self.settings = settings or Settings.from_env()
        self._sessions = None
        self._reader = None

    @property
    def sessions(self):
        """Sessions that write (submit, cancel)."""
        if self._sessions is None:
            self._sessions = open_sessions(self.settings.database_url)
        return self._sessions

    @property
    def reader(self):
        """Sessions that only read (status, wait, results): never hold SQLite's write lock."""
        if self._reader is None:
            from core.store.database import make_sessionmaker

            self._reader = make_sessionmaker(self.sessions.kw["bind"], readonly=True)
        return self._reader

    def submit(
        self,
        requests: str | Path | Iterable[Mapping[str, Any]],
        *,
        model: str | None = None,
        draft: str = "auto",
        k: int | None = None,
        chunk_size: int | None = None,
        idempotency_key: str | None = None,
        **overrides: Any,
    ) -> dict[str, Any]:
        """Queue a job from a JSONL file path or from request dicts (job-file lines).

        Keyword overrides (max_tokens, temperature, top_p, seed) win over each line's body.
        Bad lines do not raise: they are stored as failed items and listed under "invalid".
        A repeated `idempotency_key` returns the job first submitted with it.
        """
        if isinstance(requests, str | Path):
            input_file: str | None = str(requests)
            lines = iter_job_file(requests, self.settings.job_limits())
        else:
            input_file = None
            lines = (json.dumps(r) for r in requests)
        summary, bad = submit_lines(
            self.settings,
            lines,
            model=model or self.settings.model,
            draft=draft,
            k=k,
            overrides={key: v for key, v in overrides.items() if v is not None},
            chunk_size=chunk_size,
            input_file=input_file,
            sessions=self.sessions,
            idempotency_key=idempotency_key,
        )
        summary["invalid"] = [{"line": e.line, **e.to_error()} for e in bad]
        return summary

    def status(self, job_id: str) -> dict[str, Any]:
        """`applespec status --json` for a job."""
        from core.store import repo

        with self.reader() as s:
            return repo.job_summary(s, job_id)

    def wait(
        self,
        job_id: str,
        timeout: float | None = None,
        interval: float = 0.5,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Poll until the job is completed, failed or cancelled; its final status.

        Warns (NoWorkerWarning, once) when no live worker has consumed the job's queue for
        APPLESPEC_IDLE_WARNING seconds.

        Raises:
            JobTimeout: after `timeout` seconds.
        """
        from core.store.models import JOB_DONE

        deadline = None if timeout is None else time.monotonic() + timeout
        watch = IdleWatch(self.settings, job_id)
        while True:
            status = self.status(job_id)
            with self.reader() as s:
                idle = watch.check(s)
            if idle:
                warnings.warn(idle, NoWorkerWarning, stacklevel=2)
            if progress:
                from core.store.repo import duration

                c = status["request_counts"]
                eta = status["eta"]["seconds"]
                shown = f", ETA {duration(eta)}" if eta is not None else ""
                print(
                    f"\r{job_id}: {status['status']} {c['completed'] + c['failed']}/{c['total']}"
                    f"{shown}",
                    end="" if status["status"] not in JOB_DONE else "\n",
                    file=sys.stderr,
                    flush=True,
                )
            if status["status"] in JOB_DONE:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"{job_id} still {status['status']} after {timeout} s")
            time.sleep(interval)

    def results(self, job_id: str) -> Iterator[dict[str, Any]]:
        """The job's output lines (OpenAI Batch format) in input order; errors included.

        Streamed from the store a slice at a time (never the whole job in memory); the read
        session stays open while the iterator is consumed.
        """
        from core.store import repo

        with self.reader() as s:
            for _, line in repo.output_lines(s, job_id):
                yield line

    def cancel(self, job_id: str) -> str:
        """Cancel a job (`applespec cancel`: queued requests dropped now, running ones at
        their worker's next heartbeat); its status."""
        from core.store import repo

        with self.sessions() as s:
            return repo.cancel_job(s, job_id).status

    def retry(self, job_id: str, chunk_size: int | None = None) -> int:
        """Resume a job: its failed and cancelled requests queued again; how many."""
        return requeue(self.settings, self.sessions, job_id, chunk_size)
