"""`applespec run`: a job file through the engine in this process (no Redis), into the store."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import time
from typing import Any

import click

from api.openers import open_output, open_store, read_job_file
from api.options import batch_option, generation_options, model_option, overrides
from core.jobs import output_line, validate_for
from core.settings import Settings


def load_engine(model: str, draft: str, k: int | None, learn: float = 0.0, **kw):
    """Engine.load with a model the user got wrong as a one-line error; `learn`: the
    self-drafter's online learning share (APPLESPEC_LEARN_SHARE). One-time setup says
    what it does on stderr."""
    from core.engine import Engine
    from core.models import ModelError
    from core.training.online import learner_factory

    try:
        return Engine.load(
            model,
            draft=draft,
            k=k,
            learner=learner_factory(learn),
            progress=lambda s: click.echo(s, err=True),
            **kw,
        )
    except (ModelError, ValueError) as e:
        raise click.ClickException(str(e)) from e


def _answer(body: dict[str, Any]) -> str:
    choice = body["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice.get("text", "")


def _write(f, line: dict[str, Any]) -> None:
    f.write(json.dumps(line, ensure_ascii=False) + "\n")
    f.flush()


def run_digest(input_file: str, output: str, errors: str | None, *options: Any) -> str:
    """What identifies one `applespec run`: the input's bytes, where its output goes and the
    options. A run with the same digest resumes the stored job instead of starting over."""
    digest = hashlib.sha256()
    with open(input_file, "rb") as f:
        while piece := f.read(1 << 20):
            digest.update(piece)
    where = [os.path.abspath(output), os.path.abspath(errors) if errors else None]
    digest.update(json.dumps([where, options], default=str, sort_keys=True).encode())
    return digest.hexdigest()


@click.command("run")
@click.argument("input_file", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="Output JSONL."
)
@model_option
@generation_options
@batch_option
@click.option("--errors", type=click.Path(dir_okay=False), help="Write bad lines here, not to -o.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary on stdout.")
@click.option("-v", "--verbose", is_flag=True, help="Print each answer on stderr.")
def run_cmd(
    input_file: str,
    output: str,
    model: str,
    draft: str,
    k: int | None,
    batch_size: int | None,
    errors: str | None,
    as_json: bool,
    verbose: bool,
    **params: Any,
) -> None:
    """Run a job file (OpenAI Batch JSONL) on one model in this process, no Redis needed.

    Requests run together in one continuous batch, speculating per row. Output lines come
    in input order, each as soon as it and every line before it is done; every result is
    stored as it finishes. Bad lines get an error line (in --errors when given) and never
    stop the valid ones. Exit code 1 if any line failed.

    Run the same command again (same input file, output, errors and options) after it was
    interrupted, or when some requests failed, and it resumes: the stored results are
    written again and only the rest runs.

    \b
    Example:
        applespec run job.jsonl -o results.jsonl --errors errors.jsonl --max-tokens 64
    """
    from core.energy import EnergyClock, find_meter
    from core.jobs import generation_params, prompt_tokens
    from core.store import repo
    from core.store.database import StoreGone
    from core.store.models import JOB_DONE
    from worker.hooks import item_hook
    from worker.owner import owner_is_dead, worker_name
    from worker.process import start_item, store_error, store_result

    settings = Settings.from_env()
    model = settings.resolve_model(model)
    lines = read_job_file(input_file, settings)
    engine = load_engine(
        model, draft, k, settings.learn_share, max_kv_bytes=settings.kv_budget_bytes
    )
    params = overrides(**params)
    try:
        requests, bad = validate_for(
            lines,
            model,
            engine.target,
            params,
            limits=settings.job_limits(),
            aliases=settings.model_aliases,
            strict_models=settings.strict_models,
        )
    except ValueError as e:  # JobTooLarge, an override past the limits
        raise click.ClickException(str(e)) from e
    if not requests and not bad:
        raise click.ClickException(f"{input_file} has no requests")
    # One-time setup (the surface for at most this job's rows) before the job's clock.
    setup_s = engine.prepare(max_rows=batch_size or max(len(requests), 1))
    digest = run_digest(input_file, output, errors, model, draft, k, params)
    with contextlib.ExitStack() as stack:
        # Open the outputs before the job exists: a bad path is a one-line error, not a
        # job left in progress.
        out = stack.enter_context(open_output(output))
        err_out = stack.enter_context(open_output(errors)) if errors else out
        sessions = open_store(settings)
        stored: dict[int, dict[str, Any]] = {}
        with sessions() as s:
            repo.interrupt_dead_runs(s, owner_is_dead)
            previous = repo.find_resumable_run(s, digest)
            if previous is not None and previous.status not in JOB_DONE:
                raise click.ClickException(
                    f"{previous.id} runs this file into {output} in another live process; "
                    "wait for it, or write to another output file"
                )
            if previous is not None:
                job_id = previous.id
                item_ids = repo.reopen_run(s, job_id)
                for number, custom_id, body in repo.stored_results(s, job_id):
                    stored[number] = output_line(job_id, number, custom_id, body=body)
                click.echo(
                    f"resuming {job_id}: {len(stored)} results stored, {len(item_ids)} to run",
                    err=True,
                )
            else:
                job = repo.create_job(
                    s,
                    model=model,
                    drafter=draft,
                    k=k,
                    params=params,
                    mode="embedded",
                    input_file=input_file,
                    requests=requests,
                    errors=bad,
                    submission_hash=digest,
                )
                repo.mark_in_progress(s, job.id)
                s.commit()
                job_id = job.id
                item_ids = repo.open_item_ids(s, job_id)

        failed = len(bad)
        tokens = steps = 0
        start = time.perf_counter()
        pending_errors = sorted(bad, key=lambda e: e.line)
        if errors:
            for e in pending_errors:
                _write(err_out, output_line(job_id, e.line, e.custom_id, error=e.to_error()))
            pending_errors = []
        bar = stack.enter_context(
            click.progressbar(length=len(item_ids) + len(stored), label="requests", file=sys.stderr)
        )
        # Every item through one continuous batch; output lines in input order (a line
        # is written as soon as every earlier line is), each result stored as it finishes.
        ready: dict[int, tuple] = {}
        lines_left = [e.line for e in pending_errors]
        batch = engine.new_batch(batch_size)

        def emit(line: int, entry: tuple) -> None:
            nonlocal failed, tokens, steps
            kind, what = entry
            if kind == "stored":  # a result of the run this one resumes
                _write(out, what)
                bar.update(1)
                return
            if kind == "bad":
                _write(out, output_line(job_id, what.line, what.custom_id, error=what.to_error()))
                return
            done = what
            if done.error is not None:
                failed += 1
                _write(err_out, output_line(job_id, done.line, done.custom_id, error=done.error))
            else:
                _write(out, output_line(job_id, done.line, done.custom_id, body=done.body))
                tokens += len(done.result.tokens)
                steps += int(done.result.speculative.get("verify_steps") or 0)
            if verbose:
                body = done.body
                text = _answer(body) if body else done.error
                click.echo(f"\n[{done.custom_id}] {text}", err=True)
            bar.update(1)

        def flush() -> None:
            while lines_left and lines_left[0] in ready:
                line = lines_left.pop(0)
                emit(line, ready.pop(line))

        for e in pending_errors:
            ready[e.line] = ("bad", e)
        for number, line in stored.items():
            ready[number] = ("stored", line)
        try:
            started_items = []
            me = worker_name()  # recorded on each item: a reader sees when this process died
            with sessions() as s:
                for item_id in item_ids:
                    st = start_item(s, item_id, max_attempts=1, worker_host=me)
                    if st is not None:
                        started_items.append(st)
            lines_left = sorted(lines_left + list(stored) + [st.line for st in started_items])
            for st in started_items:
                try:
                    batch.submit(
                        prompt_tokens(engine.target, st.request),
                        generation_params(st.request),
                        tag=st,
                    )
                except Exception as e:  # a bad parameter or prompt fails the item alone
                    with sessions() as s:
                        ready[st.line] = ("done", store_error(s, st, e))
            flush()
            energy = EnergyClock(find_meter())
            energy.mark()
            for r in batch.run():
                joules = energy.split()
                with sessions() as s:
                    ready[r.tag.line] = (
                        "done",
                        store_result(s, r.tag, r, "local", (joules, energy.source)),
                    )
                if hook := item_hook(r.tag.custom_id):  # none in production (worker/hooks.py)
                    hook()
                flush()
        except StoreGone as e:
            raise click.ClickException(f"{e}; stopped (results so far are in {output})") from e
        flush()
    wall = time.perf_counter() - start
    with sessions() as s:
        summary = repo.job_summary(s, job_id)
    summary["output"] = output
    summary["errors_file"] = errors
    summary["run"] = {
        "setup_s": setup_s,
        "wall_s": wall,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "mean_accepted_length": tokens / steps if steps else None,
    }
    counts = summary["request_counts"]
    mal = summary["run"]["mean_accepted_length"]
    line = f"{counts['total']} requests: {counts['completed']} ok, {counts['failed']} failed; "
    line += f"{tokens} tokens in {wall:.2f} s"
    line += f" ({tokens / wall:.1f} tok/s)" if wall > 0 else ""
    line += f"; mean accepted length {mal:.2f}" if mal else ""
    line += f"; one-time setup {setup_s:.1f} s (not in the job's time)" if setup_s >= 0.5 else ""
    click.echo(f"{line}; job {job_id}", err=True)
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    if failed or counts["failed"]:
        sys.exit(1)
