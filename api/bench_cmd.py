"""`applespec bench`: ours vs mlx-lm on the same weights and prompts, side by side."""

from __future__ import annotations

import json
import sys

import click


@click.command()
@click.option("--model", default="smollm2-135m", envvar="APPLESPEC_MODEL", show_default=True)
@click.option(
    "--input",
    "input_path",
    type=click.Path(exists=True, dir_okay=False),
    help="Prompt set (JSONL with `messages` or `prompt`); default: the repo's.",
)
@click.option(
    "--drafters",
    default="ngram,auto,early-exit:8/2,early-exit:27/3",
    show_default=True,
    help="Comma-separated drafter specs; `SPEC/K` fixes the draft length.",
)
@click.option(
    "--draft-model",
    help="A draft model sharing the tokenizer (adds mlx-lm's own "
    "speculative rows and our draft-model drafter).",
)
@click.option(
    "--mlx-lm-draft-tokens",
    default="2,3,4,5,6",
    show_default=True,
    help="num_draft_tokens values tried for mlx-lm's speculative decoding.",
)
@click.option("--max-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Also write JSON here.")
def bench(
    model, input_path, drafters, draft_model, mlx_lm_draft_tokens, max_tokens, as_json, output
):
    """Measure tokens/s of mlx-lm and of each drafter on one set of prompts.

    Every configuration runs on the same loaded weights, interleaved prompt by prompt, so
    the ratios are side by side. Greedy decoding: `identical` checks each configuration's
    output against mlx-lm's, token for token.

    \b
    Examples:
      applespec bench
      applespec bench --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b --json
    """
    from core.engine import ModelError, load_model
    from core.engine.benchmark import format_table, load_prompts, run_bench

    try:
        target = load_model(model)
        draft = load_model(draft_model) if draft_model else None
    except ModelError as e:
        raise click.ClickException(str(e)) from None
    specs = [d.strip() for d in drafters.split(",") if d.strip()]
    if draft is not None:
        specs.append(f"draft-model:{draft_model}")
    try:
        ks = [int(x) for x in mlx_lm_draft_tokens.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(
            "expected comma-separated integers", param_hint="--mlx-lm-draft-tokens"
        ) from None
    prompts = load_prompts(input_path)

    def progress(msg: str) -> None:
        click.echo(f"  {msg}", err=True)

    try:
        result = run_bench(
            target, prompts, specs, max_tokens, draft, ks if draft else (), progress=progress
        )
    except ValueError as e:  # a bad drafter spec
        raise click.ClickException(str(e)) from None
    text = json.dumps(result, indent=2)
    if output:
        with open(output, "w") as f:
            f.write(text + "\n")
    click.echo(text if as_json else format_table(result))
    sys.stdout.flush()
