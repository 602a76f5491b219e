"""`applespec calibrate`: train a self-drafter on a workload's prompts and keep it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from api.options import model_option

ADAPTER_TOKENS = 60_000  # training positions for an early-exit adapter
HEAD_PASSES = (
    12  # passes over the training positions for the feature head (h200-calibrate-open-head-1M.json)
)


def _requests(paths: tuple[str, ...], model: str, target, settings) -> list:
    """Every request line of the data files; a file that is empty or has a bad line is a
    one-line error."""
    from core.jobs import JobTooLarge, iter_job_file, validate_for

    out = []
    for path in paths:
        try:
            lines = iter_job_file(path, settings.job_limits())
            requests, bad = validate_for(lines, model, target, limits=settings.job_limits())
        except JobTooLarge as e:
            raise click.ClickException(str(e)) from e
        except OSError as e:
            raise click.ClickException(f"cannot read {path}: {e.strerror or e}") from e
        except ValueError as e:
            raise click.ClickException(f"{path}: {e}") from e
        if bad:
            more = f" (and {len(bad) - 1} more bad lines)" if len(bad) > 1 else ""
            raise click.ClickException(f"{path}: {bad[0].message}{more}")
        if not requests:
            raise click.ClickException(f"{path} has no request lines")
        out += requests
    return out


@click.command("calibrate")
@model_option
@click.option(
    "--data",
    "data",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Job file(s) of the workload's prompts (OpenAI Batch lines); repeat for more.",
)
@click.option(
    "--exit-layer",
    "exit_layers",
    help="L: the target's first L layers run before the trained block (default: a fifth "
    "of the layers); several (4,6,8) train one adapter each on the same answers and report "
    "which promises the most speedup (`--draft adapter` takes that one). `head` trains the "
    "feature head over the last layer's states instead (`--draft head`), e.g. 6,head.",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=1),
    help="Training positions seen in all (epochs over the answers until reached). Default: "
    f"{ADAPTER_TOKENS} for an adapter; for the head {HEAD_PASSES} passes over its training "
    "positions (it learns slowly: on 195 open prompts 0.11 held-out agreement after 200k "
    "positions, 0.52 after 1M).",
)
@click.option(
    "--held-out",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.2,
    show_default=True,
    help="Share of the distinct prompts held out for measuring agreement.",
)
@click.option(
    "--samples",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Sampled answers (temperature 0.7) per training prompt, beside the greedy one.",
)
@click.option("--max-tokens", type=click.IntRange(min=1), help="Override every line's max_tokens.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--answers",
    type=click.Path(dir_okay=False),
    help="Keep the model's answers in this file (their features beside it) and reuse them on "
    "a later run with the same model, data and settings.",
)
@click.option(
    "--draft-vocab",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Score only the N tokens the training answers hold most in the draft head (an "
    "adapter's or the feature head's: a cheaper draft token and cheaper training; 0 = the "
    "whole vocabulary).",
)
@click.option("--no-save", is_flag=True, help="Measure only; do not store the adapter.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def calibrate_cmd(
    model,
    data,
    exit_layers,
    tokens,
    held_out,
    samples,
    max_tokens,
    lr,
    seed,
    answers,
    draft_vocab,
    no_save,
    as_json,
) -> None:
    """Train an early-exit adapter (or with `--exit-layer head` the feature head) from the
    model's own answers to a workload's prompts.

    The distinct prompts are split (a seeded hash) into training prompts and held-out
    prompts never trained on. The model answers all of them, batched; the adapter (one
    trained block after layer L, the model's own norm and head) learns the model's
    next-token distributions on the training answers. Prints held-out agreement with the
    full model before and after, and the learning curve; stores the adapter under
    APPLESPEC_HOME/adapters/ for `--draft adapter:L` / `--draft adapter` / `auto`. The
    feature head (EAGLE-style: the last layer's state and the next token's embedding, one
    trained block, the model's norm and head) is stored beside them for `--draft head`.

    \b
    Example:
        applespec calibrate --data examples/jobs/open-256.jsonl --exit-layer 6 --tokens 60000
        applespec calibrate --data examples/jobs/open-256.jsonl --exit-layer 6,head
    """
    from core.jobs import generation_params, prompt_tokens
    from core.models import ModelError, load_model
    from core.settings import Settings
    from core.training.adapter import TrainConfig
    from core.training.calibration import calibrate

    settings = Settings.from_env()
    model = settings.resolve_model(model)
    try:
        target = load_model(model)
    except ModelError as e:  # one line, even when the hub's own message has several
        raise click.ClickException(" ".join(str(e).split())) from e
    layers = _layers(exit_layers, target.num_layers)
    requests = _requests(data, model, target, settings)
    prompts = [prompt_tokens(target, r) for r in requests]
    caps = [max_tokens or generation_params(r).max_tokens for r in requests]
    budget = tokens or ADAPTER_TOKENS
    cfg = TrainConfig(tokens=budget, lr=lr, seed=seed, eval_every=max(1, budget // 8))
    bars: dict[str, object] = {}
    tty = sys.stderr.isatty()
    shown: dict[str, int] = {}

    def progress(phase: str, done: int, total: int) -> None:
        label = {"answers": "answering", "train": "training"}[phase]
        if not tty:  # a log: a line per tenth
            tenth = done * 10 // max(total, 1)
            if tenth > shown.get(phase, -1):
                shown[phase] = tenth
                click.echo(f"{label} {done}/{total}", err=True)
            return
        bar = bars.get(phase)
        if bar is None:
            bar = bars[phase] = click.progressbar(length=total, label=label, file=sys.stderr)
            bar.__enter__()
        bar.update(done - bar.pos)
        if done >= total:
            bar.__exit__(None, None, None)

    from core.engine.costs import load_kept

    surface = load_kept(target.model, target.weight_format)
    verify_cost = None if surface is None else surface.verify_cost(1)
    memo: dict = {}
    reports = []
    try:
        for layer in layers:
            shown.clear()
            reports.append(
                calibrate(
                    target,
                    prompts,
                    layer,
                    max_tokens=caps,
                    config=cfg,
                    held_out=held_out,
                    samples=samples,
                    store=not no_save,
                    answers=Path(answers) if answers else None,
                    draft_vocab=draft_vocab,
                    progress=progress,
                    verify_cost=verify_cost,
                    memo=memo,
                    passes=HEAD_PASSES if layer == "head" and tokens is None else None,
                )
            )
            bars.pop("train", None)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    except OSError as e:  # the answers file
        raise click.ClickException(f"cannot write {e.filename}: {e.strerror or e}") from e
    finally:
        for bar in bars.values():
            if not bar.finished:
                bar.__exit__(None, None, None)
    chosen = max(reports, key=lambda r: (r.speedup, r.after))
    priced = "this machine's verify costs at batch 1" if surface else "verify width free"
    if as_json:
        if len(reports) == 1:
            click.echo(json.dumps(reports[0].to_json(), indent=2))
        else:
            out = {"layers": [r.to_json() for r in reports], "chosen": chosen.layer}
            out["chosen_kind"] = chosen.kind
            click.echo(json.dumps({**out, "priced_at": priced}, indent=2))
        return
    for report in reports:
        _print(report)
    if len(reports) > 1:
        click.echo(f"by layer ({priced}):")
        for r in reports:
            click.echo(
                f"  {_name(r):<5} agreement {r.after:.3f}  draft token {r.draft_share:.1%} of "
                f"the model  -> k {r.draft_length}, {r.speedup:.2f}x"
            )
        click.echo(f"chosen: {_name(chosen)} (`--draft adapter` takes it)")


def _layers(spec: str | None, n: int) -> list[int | str]:
    """`--exit-layer 6`, `4,6,8` or `6,head` -> the layers, "head" last (default: a fifth
    of the model's)."""
    if spec is None:
        return [max(1, n // 5)]
    parts = [x.strip() for x in spec.split(",")]
    try:
        layers = [int(x) for x in parts if x != "head"]
    except ValueError:
        raise click.ClickException(
            f"--exit-layer takes a layer, `head` or a comma-separated list (4,6,head), got {spec!r}"
        ) from None
    for layer in layers:
        if not 0 < layer < n:
            raise click.ClickException(f"--exit-layer must be between 1 and {n - 1}, got {layer}")
    return sorted(set(layers)) + (["head"] if "head" in parts else [])


def _name(report) -> str:
    return "feature head" if report.kind == "feature-head" else f"L{report.layer}"


def _print(report) -> None:
    layer = report.layer
    what = (
        "feature head over the last layer's states"
        if report.kind == "feature-head"
        else f"early-exit adapter at layer {layer}"
    )
    click.echo(
        f"{report.model}: {what}, {report.params:,} trained "
        f"parameters ({report.params_share:.1%} of the model)"
    )
    click.echo(
        f"prompts: {report.train_prompts} training ({report.train_positions} positions), "
        f"{report.held_out_prompts} held out ({report.held_out_positions} positions)"
    )
    click.echo("held-out top-1 agreement with the full model:")
    if report.early_exit is not None:
        click.echo(f"  early exit at {layer} (untrained)   {report.early_exit:.3f}")
    click.echo(f"  before training               {report.before:.3f}  (KL {report.kl_before:.3f})")
    click.echo(f"  after {report.tokens} positions  {report.after:.3f}  (KL {report.kl_after:.3f})")
    if report.second is not None:
        click.echo(f"  second draft token (reads its own predicted state)  {report.second:.3f}")
    if report.draft_vocab is not None:
        who = "feature head" if report.kind == "feature-head" else "adapter"
        click.echo(
            f"  (the {who} drafts the {report.draft_vocab} tokens its answers hold most: "
            f"{report.vocab_coverage:.1%} of the held-out answers' tokens)"
        )
    click.echo("learning curve (training positions seen -> agreement):")
    for seen, a in report.curve:
        click.echo(f"  {seen:>8}  {a:.3f}")
    secs = ", ".join(f"{k[:-2]} {v:.0f} s" for k, v in report.seconds.items())
    click.echo(f"time: {secs}")
    if report.path:
        click.echo(f"stored: {report.path}")
