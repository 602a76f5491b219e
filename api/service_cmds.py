"""The batch service commands: submit, status, wait, results, jobs, cancel, retry, worker, db."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager
from typing import Any

import click

from api.openers import open_output, open_store, read_job_file
from api.options import batch_option, generation_options, model_option, overrides
from core.settings import Settings


@contextmanager
def _session(readonly: bool = False):
    """A session on the configured store; an unknown job id is a one-line error."""
    from core.store.repo import UnknownJob, interrupt_dead_runs
    from worker.owner import owner_is_dead

    sessions = open_store(Settings.from_env(), readonly=readonly)
    with sessions() as session:
        # An `applespec run` whose process died shows as interrupted, not running forever.
        interrupt_dead_runs(session, owner_is_dead)
        try:
            yield session
        except UnknownJob as e:
            raise click.ClickException(str(e)) from e


def _broker_error(settings: Settings, e: Exception) -> click.ClickException:
    from api.client import broker_message

    return click.ClickException(broker_message(settings, e))


@click.command("submit")
@click.argument("input_file", type=click.Path(exists=True, dir_okay=False))
@model_option
@generation_options
@click.option(
    "--chunk-size",
    type=click.IntRange(min=1),
    help="Items per worker task (default APPLESPEC_CHUNK_SIZE or 8).",
)
@click.option(
    "--idempotency-key",
    help="Submitting again with the same key returns the job first submitted with it.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the job as a JSON object.")
def submit_cmd(
    input_file: str,
    model: str,
    draft: str,
    k: int | None,
    chunk_size: int | None,
    idempotency_key: str | None,
    as_json: bool,
    **params: Any,
) -> None:
    """Validate a job file, store it and queue it for the workers of its model.

    Every line is checked with the same rules as `applespec run` (with the model's tokenizer;
    no weights are loaded); bad lines are stored as failed items with their error. The job
    id is the last line printed.

    \b
    Example:
        applespec submit job.jsonl --model tiny-random --max-tokens 32
        applespec submit job.jsonl --idempotency-key nightly-2026-12-01
        applespec wait "$(applespec submit job.jsonl | tail -1)"
    """
    from api.client import BrokerUnavailable, submit_lines
    from core.models import ModelError

    settings = Settings.from_env()
    lines = read_job_file(input_file, settings)
    try:
        summary, bad = submit_lines(
            settings,
            lines,
            model=model,
            draft=draft,
            k=k,
            overrides=overrides(**params),
            chunk_size=chunk_size,
            input_file=input_file,
            sessions=open_store(settings),
            idempotency_key=idempotency_key,
        )
    except (ModelError, BrokerUnavailable, ValueError) as e:
        # ValueError: a drafter a job may not name, too many lines, a reused key, bad options.
        raise click.ClickException(settings.redact(str(e))) from e
    counts = summary["request_counts"]
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    if summary.get("replayed"):
        click.echo(
            f"{summary['id']}: already submitted with key {idempotency_key!r} "
            f"({summary['status']}, {counts['total']} lines, {len(bad)} invalid)",
            err=True,
        )
        click.echo(summary["id"])
        return
    click.echo(
        f"{counts['total']} lines: {summary['queued']} queued on {summary['queue']} "
        f"in {summary['chunks']} chunks, {len(bad)} invalid",
        err=True,
    )
    for e in bad:
        click.echo(f"  {e.message}", err=True)
    click.echo(summary["id"])


def _status_line(summary: dict[str, Any]) -> str:
    from core.store.repo import duration

    c, m = summary["request_counts"], summary["metrics"]
    line = f"{summary['id']}: {summary['status']}, {c['completed']}/{c['total']} completed"
    line += f", {c['failed']} failed"
    if m["tokens_per_s"]:
        line += f"; {m['completion_tokens']} tokens, {m['tokens_per_s']:.1f} tok/s"
    if m["acceptance_rate"] is not None:
        line += f"; acceptance {m['acceptance_rate']:.2f}"
    if m["mean_accepted_length"]:
        line += f", mean accepted length {m['mean_accepted_length']:.2f}"
    if m.get("forced_tokens") is not None:
        line += f"; {m['forced_tokens']} tokens forced by the schema, {m['mask_s']:.2f} s in masks"
    energy = summary["energy"]
    if energy["joules"] is None:
        line += "; energy not measured"
    else:
        per = energy["joules_per_1k_tokens"]
        line += f"; {energy['joules']:.1f} J" + (f" ({per:.1f} J/1k tokens)" if per else "")
        line += f" by {', '.join(energy['sources'])}"
    eta = summary["eta"]["seconds"]
    if eta is not None:
        line += f"; ETA {duration(eta)}"
    if summary.get("resumable"):
        how = (
            "run the same `applespec run` command again"
            if summary["mode"] == "embedded"
            else f"`applespec retry {summary['id']}`"
        )
        line += f"; {summary['resumable']} requests resumable: {how}"
    return line


@click.command("status")
@click.argument("job_id")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
def status_cmd(job_id: str, as_json: bool) -> None:
    """Show a job's status, request counts, acceptance and throughput so far."""
    from core.store import repo

    with _session(readonly=True) as s:
        summary = repo.job_summary(s, job_id)
    click.echo(json.dumps(summary, indent=2) if as_json else _status_line(summary))


@click.command("wait")
@click.argument("job_id")
@click.option("--timeout", type=click.FloatRange(min=0), help="Give up after S seconds (exit 2).")
@click.option("--interval", type=click.FloatRange(min=0.05), default=0.5, show_default=True)
def wait_cmd(job_id: str, timeout: float | None, interval: float) -> None:
    """Wait for a job to finish, with a progress bar.

    Exit code 0 when every request completed, 1 when the job failed, was cancelled or has
    failed requests, 2 on timeout. Warns once when no live worker has consumed the job's
    queue for APPLESPEC_IDLE_WARNING seconds (30 by default).
    """
    from api.client import IdleWatch
    from core.store import repo
    from core.store.models import JOB_DONE
    from worker.owner import owner_is_dead

    settings = Settings.from_env()
    deadline = None if timeout is None else time.monotonic() + timeout
    watch = IdleWatch(settings, job_id)
    with _session(readonly=True) as s:
        summary = repo.job_summary(s, job_id)
        s.rollback()
        total = summary["request_counts"]["total"]
        with click.progressbar(length=total, label=job_id, file=sys.stderr) as bar:
            seen = 0
            while True:
                c = summary["request_counts"]
                bar.update(max(0, c["completed"] + c["failed"] - seen))
                seen = c["completed"] + c["failed"]
                if summary["eta"]["seconds"] is not None:
                    bar.label = f"{job_id} (ETA {repo.duration(summary['eta']['seconds'])})"
                if summary["status"] in JOB_DONE:
                    break
                idle = watch.check(s)
                if idle:
                    click.echo(f"\nwarning: {idle}", err=True)
                if deadline is not None and time.monotonic() >= deadline:
                    click.echo(f"\ntimed out: {_status_line(summary)}", err=True)
                    sys.exit(2)
                s.rollback()
                time.sleep(interval)
                repo.interrupt_dead_runs(s, owner_is_dead)
                summary = repo.job_summary(s, job_id)
                s.rollback()  # end the read transaction: never hold the store between polls
    click.echo(_status_line(summary), err=True)
    if summary["status"] != "completed" or summary["request_counts"]["failed"]:
        sys.exit(1)


@click.command("results")
@click.argument("job_id")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False))
@click.option("--errors", type=click.Path(dir_okay=False), help="Write error lines here.")
def results_cmd(job_id: str, output: str, errors: str | None) -> None:
    """Write a job's results (OpenAI Batch output format), in input order.

    Requests still queued or running are left out (a note says how many).
    """
    from core.store import repo

    written = {True: 0, False: 0}
    with _session(readonly=True) as s:
        summary = repo.job_summary(s, job_id)  # an unknown job fails before any file opens
    with _session(readonly=True) as s, open_output(output) as out:
        err = open_output(errors) if errors else out
        try:
            for ok, line in repo.output_lines(s, job_id):
                (out if ok else err).write(json.dumps(line, ensure_ascii=False) + "\n")
                written[ok] += 1
        finally:
            if errors:
                err.close()
    left = summary["request_counts"]["total"] - written[True] - written[False]
    note = f"{written[True]} results, {written[False]} errors written"
    click.echo(
        note + (f"; {left} not finished yet ({summary['status']})" if left else ""), err=True
    )


@click.command("jobs")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def jobs_cmd(limit: int, as_json: bool) -> None:
    """List the most recent jobs."""
    from core.store import repo

    with _session(readonly=True) as s:
        rows = [
            {
                "id": j.id,
                "status": j.status,
                "mode": j.mode,
                "model": j.model,
                "created_at": repo.aware(j.created_at).isoformat(),
                "request_counts": {"total": j.total, "completed": j.completed, "failed": j.failed},
                "input_file": j.input_file,
            }
            for j in repo.list_jobs(s, limit)
        ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        c = r["request_counts"]
        click.echo(
            f"{r['id']}  {r['status']:<11} {r['mode']:<8} {c['completed']}/{c['total']} "
            f"({c['failed']} failed)  {r['model']}  {r['created_at'][:19]}  {r['input_file']}"
        )


@click.command("cancel")
@click.argument("job_id")
def cancel_cmd(job_id: str) -> None:
    """Cancel a job: queued requests are dropped now; requests already running stop at
    their worker's next heartbeat (APPLESPEC_HEARTBEAT_INTERVAL, 5 s), and one that
    finishes before then keeps its result. `applespec retry JOB` resumes a cancelled job."""
    from core.store import repo

    with _session() as s:
        job = repo.cancel_job(s, job_id)
        click.echo(f"{job.id}: {job.status}")


@click.command("retry")
@click.argument("job_id")
@click.option("--chunk-size", type=click.IntRange(min=1))
def retry_cmd(job_id: str, chunk_size: int | None) -> None:
    """Resume a job: queue its failed and cancelled requests again (bad input lines stay
    failed), and the requests whose worker died (their lease expired) without waiting for a
    worker's sweep. A cancelled job is in progress again."""
    from api.client import BrokerUnavailable, requeue
    from core.store.repo import UnknownJob

    settings = Settings.from_env()
    try:
        n = requeue(settings, open_store(settings), job_id, chunk_size)
    except (UnknownJob, ValueError, BrokerUnavailable) as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"{job_id}: {n} requests queued again")


POOLS = ("prefork", "solo", "threads")


def default_pool() -> str:
    """`solo` on macOS (no fork after MLX: celery #9894, Metal), `prefork` elsewhere."""
    return "solo" if sys.platform == "darwin" else "prefork"


@click.command("worker", context_settings={"ignore_unknown_options": True})
@model_option
@click.option("--queues", "-Q", help="Comma-separated queues (default: the model's queue).")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=1, show_default=True)
@batch_option
@click.option("--loglevel", "-l", default="INFO", show_default=True)
@click.option("--hostname", "-n", help="Node name (default: applespec-PID@HOST).")
@click.option(
    "--pool",
    type=click.Choice(POOLS),
    default=default_pool,
    envvar="APPLESPEC_WORKER_POOL",
    show_default="solo on macOS, prefork elsewhere",
    help="Celery pool. `solo` runs the model in this process, which never forks (the "
    "default on macOS, where a forked process cannot use Metal); run several workers for "
    "several processes.",
)
@click.argument("celery_args", nargs=-1, type=click.UNPROCESSED)
def worker_cmd(
    model: str,
    queues: str | None,
    concurrency: int,
    batch_size: int | None,
    loglevel: str,
    hostname: str | None,
    pool: str,
    celery_args: tuple[str, ...],
) -> None:
    """Start a Celery worker for a model's queue; each pool process loads the model once
    and runs one continuous batch fed by the chunks it takes.

    MLX is loaded only in the process that runs the model, after any fork, on its engine
    thread (worker.runtime): the parent of a prefork pool never imports it. On macOS the
    default pool is `solo` (celery #9894: prefork crashes there; Metal is not fork-safe):
    for N processes per Mac, start N workers, e.g. `honcho start -c worker=N`.

    Extra arguments go to `celery worker` unchanged.

    \b
    Examples:
        applespec worker --model smollm2-135m --concurrency 2      # Linux: prefork
        applespec worker --model smollm2-135m --pool solo          # one process
    """
    import dataclasses
    import os

    from worker.app import create_app, queue_name

    env = Settings.from_env()
    model = env.resolve_model(model)
    settings = dataclasses.replace(env, model=model, batch_size=batch_size or env.batch_size)
    if pool == "solo" and concurrency > 1:
        raise click.ClickException(
            "--pool solo runs one process: start several workers for more (each with its "
            "own --hostname), or use --pool prefork where fork is safe (Linux)"
        )
    _check_store(settings)
    app = create_app(settings)
    argv = [
        "worker",
        f"--queues={queues or queue_name(model)}",
        f"--concurrency={concurrency}",
        f"--loglevel={loglevel}",
        f"--hostname={hostname or f'applespec-{os.getpid()}@%h'}",
        f"--pool={pool}",
        *celery_args,
    ]
    app.worker_main(argv)


def _check_store(settings: Settings) -> None:
    """A worker starts only on a migrated database (it must not create an empty one)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import SQLAlchemyError

    from migrations import current_revision, head_revision

    url = make_url(settings.database_url)
    shown = _safe_url(settings.database_url)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        from pathlib import Path

        if not Path(url.database).expanduser().is_file():
            raise click.ClickException(
                f"no database at {shown}; run `applespec db upgrade` first (APPLESPEC_DATABASE_URL)"
            )
    try:
        current = current_revision(settings.database_url)
    except SQLAlchemyError as e:
        raise click.ClickException(
            settings.redact(f"cannot open the database {shown}: {type(e).__name__}: {e}")
        ) from e
    if current != head_revision():
        raise click.ClickException(
            f"the database {shown} is at revision {current or 'none'}, this worker needs "
            f"{head_revision()}; run `applespec db upgrade`"
        )


@click.group("db")
def db_group() -> None:
    """Database schema commands."""


@db_group.command("upgrade")
@click.option("--revision", default="head", show_default=True)
def db_upgrade_cmd(revision: str) -> None:
    """Migrate the database to the latest schema (idempotent).

    The database is APPLESPEC_DATABASE_URL: SQLite at
    $XDG_DATA_HOME/applespec/applespec.db (~/.local/share/applespec/applespec.db) by default,
    or PostgreSQL with postgresql+psycopg://USER@HOST:PORT/DB.
    """
    from sqlalchemy.exc import SQLAlchemyError

    from migrations import upgrade

    settings = Settings.from_env()
    try:
        upgrade(settings.database_url, revision)
    except SQLAlchemyError as e:
        raise click.ClickException(settings.redact(f"cannot migrate the database: {e}")) from e
    click.echo(f"database at {revision}: {_safe_url(settings.database_url)}")


def _safe_url(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


SERVICE_COMMANDS = (
    submit_cmd,
    status_cmd,
    wait_cmd,
    results_cmd,
    jobs_cmd,
    cancel_cmd,
    retry_cmd,
    worker_cmd,
    db_group,
)
