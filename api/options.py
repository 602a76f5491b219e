"""The command line's options shared by its commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from core.settings import DEFAULT_MODEL


def model_option(f: Callable) -> Callable:
    return click.option(
        "--model",
        envvar="APPLESPEC_MODEL",
        default=DEFAULT_MODEL,
        show_default=True,
        help="Model spec: alias, .gguf path, mlx-lm directory or hub id.",
    )(f)


def _check_draft(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    from core.engine import parse_draft_spec

    try:
        parse_draft_spec(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from e
    return value


def generation_options(f: Callable) -> Callable:
    """--draft, --k, --max-tokens, --temperature, --top-p, --seed; they override job lines."""
    options = [
        click.option(
            "--draft",
            default="auto",
            show_default=True,
            callback=_check_draft,
            help="Drafter: none, ngram, suffix, tree, early-exit:L, adapter[:L], head[:W], "
            "draft-model:NAME or auto.",
        ),
        click.option("--k", type=click.IntRange(min=1), help="Draft length (default: adaptive)."),
        click.option("--max-tokens", type=click.IntRange(min=1), help="Override max_tokens."),
        click.option("--temperature", type=click.FloatRange(min=0), help="Override temperature."),
        click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), help="Override top_p."),
        click.option("--seed", type=int, help="Override seed."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def overrides(**params: Any) -> dict[str, Any]:
    """The generation parameters given on the command line (None = not given)."""
    keys = ("max_tokens", "temperature", "top_p", "seed")
    return {k: params[k] for k in keys if params.get(k) is not None}


def batch_option(f: Callable) -> Callable:
    return click.option(
        "--batch-size",
        type=click.IntRange(min=1),
        envvar="APPLESPEC_BATCH_SIZE",
        help="Rows generated together (default: chosen from this machine's measured "
        "verify-cost surface, kept under APPLESPEC_HOME).",
    )(f)
