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

import json
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from core.jobs import LineError, validate_for
from core.settings import Settings


class BrokerUnavailable(RuntimeError):
    """The broker (Redis) could not be reached to queue a job."""


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
    lines: list[str],
    *,
    model: str,
    draft: str = "auto",
    k: int | None = None,
    overrides: Mapping[str, Any] | None = None,
    chunk_size: int | None = None,
    input_file: str | None = None,
    sessions=None,
    target=None,
    any_model_name: bool = False,
    on_create: Callable[[Any, Any], None] | None = None,
) -> tuple[dict[str, Any], list[LineError]]:
    """Validate job lines, store the job and queue its valid items in chunks.

    Args:
        target: the loaded model, when the caller keeps one (else it is loaded here).
        any_model_name: accept any body "model" (see core.jobs.validate_for).
        on_create: called as `on_create(session, job)` once the job is stored, in the same
            transaction (the HTTP API attaches its batch row there).

    Returns:
        The job summary (`applespec status --json`, plus queue and chunks) and the bad lines.

    Raises:
        ModelError: the model cannot be loaded (its tokenizer is needed for validation).
        BrokerUnavailable: Redis is down; when the job was already stored, a worker's sweep
            queues it once the broker is back.
    """
    from core.engine import load_model
    from core.store import repo
    from worker.app import create_app, queue_name
    from worker.enqueue import broker_epoch, enqueue

    target = target or load_model(model)
    requests, bad = validate_for(lines, model, target, overrides, any_model_name=any_model_name)
    try:
        epoch = broker_epoch(settings.broker_url)
    except Exception as e:
        raise BrokerUnavailable(broker_message(settings, e)) from e
    sessions = sessions or open_sessions(settings.database_url)
    with sessions() as s:
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
    summary.update(queue=job.queue, chunks=chunks, queued=len(ids))
    return summary, bad


def broker_message(settings: Settings, e: Exception) -> str:
    return (
        f"cannot reach the broker at {settings.broker_url} ({type(e).__name__}: {e}); "
        "is Redis running? (APPLESPEC_BROKER_URL)"
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
        **overrides: Any,
    ) -> dict[str, Any]:
        """Queue a job from a JSONL file path or from request dicts (job-file lines).

        Keyword overrides (max_tokens, temperature, top_p, seed) win over each line's body.
        Bad lines do not raise: they are stored as failed items and listed under "invalid".
        """
        if isinstance(requests, str | Path):
            input_file: str | None = str(requests)
            lines = Path(requests).read_text(encoding="utf-8").splitlines()
        else:
            input_file = None
            lines = [json.dumps(r) for r in requests]
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

        Raises:
            JobTimeout: after `timeout` seconds.
        """
        from core.store.models import JOB_DONE

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(job_id)
            if progress:
                c = status["request_counts"]
                print(
                    f"\r{job_id}: {status['status']} {c['completed'] + c['failed']}/{c['total']}",
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
        """The job's output lines (OpenAI Batch format) in input order; errors included."""
        from core.store import repo

        with self.reader() as s:
            lines = [line for _, line in repo.output_lines(s, job_id)]
        yield from lines

    def cancel(self, job_id: str) -> str:
        from core.store import repo

        with self.sessions() as s:
            return repo.cancel_job(s, job_id).status
