"""`applespec bench`: ours vs mlx-lm's batch_generate on a job file, side by side."""

from __future__ import annotations

import json
import sys

import click

from api.options import model_option

ROWS = (
    "mlx_lm",
    "mlx_lm_spec",
    "ours_single",
    "ours_single_spec",
    "ours_batched",
    "ours_batched_spec",
    "ours_batched_free",  # plain, every response_format dropped (jobs that have them)
)
DEFAULT_ROWS = ("mlx_lm", "ours_single", "ours_single_spec", "ours_batched", "ours_batched_spec")


def _sizes(value: str | None, param: str) -> list[int] | None:
    if value is None:
        return None
    try:
        sizes = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(
            "expected comma-separated batch sizes like 8,16,32", param_hint=param
        )
    return sizes


@click.command()
@model_option
@click.option(
    "--input",
    "input_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Job file (the OpenAI Batch lines `run` and `submit` take); default: "
    "examples/jobs/grounded-64.jsonl.",
)
@click.option("--draft", default="auto", show_default=True, help="Drafter of the *_spec rows.")
@click.option(
    "--also-draft",
    help="More drafters side by side with --draft, comma-separated: rows "
    "ours_batched_draft-SPEC_B (e.g. --draft suffix --also-draft ngram).",
)
@click.option("--draft-model", help="A draft model sharing the tokenizer (for auto / draft-model).")
@click.option(
    "--batch-sizes",
    help="mlx-lm batch sizes to try (default 8,16,32,64; on a GPU up to 256).",
)
@click.option(
    "--our-batch-sizes",
    help="Our batch sizes to try (default: the one the cost surface picks).",
)
@click.option(
    "--rows",
    default=",".join(DEFAULT_ROWS),
    show_default=True,
    help="Which configurations to run (also mlx_lm_spec: mlx-lm's own speculative "
    "decoding with --draft-model, one row at a time).",
)
@click.option(
    "--reference",
    type=click.Choice(["mlx_lm", "ours_single"]),
    default="mlx_lm",
    show_default=True,
    help="Plain single-row greedy the identical counts compare with.",
)
@click.option(
    "--reference-items",
    type=click.IntRange(1),
    help="Check identity on the first N items only (the reference runs on those).",
)
@click.option("--max-tokens", type=click.IntRange(1), help="Override every line's max_tokens.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Also write JSON here.")
@click.option(
    "--phases",
    is_flag=True,
    help="Time each part of our engine's steps in the timed runs (printed, and in the JSON).",
)
@click.option(
    "--repeat",
    type=click.IntRange(1),
    default=1,
    show_default=True,
    help="Time every configuration N times, in rounds that run each once in turn; a row's "
    "time is its median round, and the speculative rows' ratios are given per round.",
)
def bench(
    model,
    input_path,
    draft,
    also_draft,
    draft_model,
    batch_sizes,
    our_batch_sizes,
    rows,
    reference,
    reference_items,
    max_tokens,
    as_json,
    output,
    phases,
    repeat,
):
    """Tokens/s of mlx-lm's batch_generate and of our engine on one job, same weights.

    Every configuration runs the whole job greedily in this process, so the ratios are
    side by side. `identical` counts items whose output equals plain single-row greedy;
    for the others the reference's top-1 minus top-2 logit at the first difference is
    shown (a gap above 0.05 is a bug, not rounding).

    \b
    Examples:
      applespec bench --input examples/jobs/grounded-64.jsonl
      applespec bench --input job.jsonl --batch-sizes 16,32 --rows mlx_lm,ours_batched_spec --json
      applespec bench --input job.jsonl --draft suffix --also-draft ngram --rows ours_batched_spec
      applespec bench --input examples/jobs/labeling-json-64.jsonl --reference ours_single

    Lines with a `response_format` are constrained in every row (mlx-lm's through a logits
    processor with the same grammar engine) but `ours_batched_free`, which drops them; the
    table then counts the answers valid under their schema.
    """
    import mlx.core as mx

    from core.benchmark import JobFileError, format_table, load_job, run_bench
    from core.models import ModelError, load_model

    wanted = {r.strip() for r in rows.split(",") if r.strip()}
    if not wanted or wanted - set(ROWS):
        raise click.BadParameter(f"choose from {', '.join(ROWS)}", param_hint="--rows")
    gpu = mx.default_device() == mx.gpu
    mlx_sizes = _sizes(batch_sizes, "--batch-sizes") or (
        [8, 16, 32, 64, 128, 256] if gpu else [8, 16, 32, 64]
    )
    ours = _sizes(our_batch_sizes, "--our-batch-sizes")
    try:
        target = load_model(model)
        dm = load_model(draft_model) if draft_model else None
        items = load_job(target, input_path, max_tokens)
    except (ModelError, JobFileError) as e:
        raise click.ClickException(str(e)) from None

    def progress(msg: str) -> None:
        click.echo(f"  {msg}", err=True)

    try:
        result = run_bench(
            target,
            items,
            drafter=draft,
            mlx_lm_batches=[b for b in mlx_sizes if b <= max(len(items), 1)] or mlx_sizes[:1],
            our_batches=ours,
            draft_model=dm,
            reference=reference,
            reference_items=reference_items,
            configs=wanted,
            also_draft=[d.strip() for d in (also_draft or "").split(",") if d.strip()],
            progress=progress,
            phases=phases,
            repeat=repeat,
        )
    except ValueError as e:  # a bad drafter spec
        raise click.ClickException(str(e)) from None
    text = json.dumps(result, indent=2)
    if output:
        with open(output, "w") as f:
            f.write(text + "\n")
    click.echo(text if as_json else format_table(result))
    sys.stdout.flush()
