"""`applespec costs`: the verify-cost surface this machine keeps for a model, measured again
on request."""

from __future__ import annotations

import click

from api.options import model_option


@click.command("costs")
@model_option
@click.option(
    "--measure",
    is_flag=True,
    help="Measure the surface again now and keep it (do it while nothing else loads the "
    "machine: a surface measured under load misprices drafts).",
)
def costs_cmd(model, measure):
    """Show the verify-cost surface kept for MODEL on this machine (the draft-length policy
    prices drafts with it), or measure it again.

    The surface is measured once per machine and model, on first use, and kept under
    APPLESPEC_HOME. If that first use ran while other work loaded the machine, its prices are
    off for good: `--measure` replaces it.
    """
    from core.engine.costs import (
        format_surface,
        load_kept,
        measure_and_keep,
        surface_path,
    )
    from core.models import ModelError, load_model

    try:
        target = load_model(model)
    except ModelError as e:
        raise click.ClickException(str(e)) from None
    path = surface_path(target.model, target.weight_format)
    if measure:
        surface = measure_and_keep(
            target.model,
            target.name,
            target.weight_format,
            progress=lambda s: click.echo(f"  {s}", err=True),
        )
    else:
        surface = load_kept(target.model, target.weight_format)
        if surface is None:
            click.echo(f"no surface kept for {target.name} on this machine yet ({path});")
            click.echo("it is measured on first use, or now with `applespec costs --measure`")
            return
    click.echo(f"{target.name} ({target.weight_format}): {path}")
    click.echo("\n".join(format_surface(surface.to_json())))
