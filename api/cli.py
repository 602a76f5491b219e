"""The `applespec` command line."""

from __future__ import annotations

import os
import sys

import click

from api.bench_cmd import bench
from api.blas import reexec_with_openblas
from api.calibrate_cmd import calibrate_cmd
from api.costs_cmd import costs_cmd
from api.keys_cmds import keys_group
from api.models_cmds import models
from api.report_cmd import report_cmd
from api.run_cmd import run_cmd
from api.serve_cmd import serve_cmd
from api.service_cmds import SERVICE_COMMANDS
from core.settings import SettingsError


class _Cli(click.Group):
    """The command group; a bad APPLESPEC_* setting is a one-line error in any command."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except SettingsError as e:
            raise click.ClickException(str(e)) from e


@click.group(cls=_Cli)
@click.version_option(package_name="applespec")
def cli() -> None:
    """AppleSpec: batch LLM inference with lossless speculative decoding on MLX."""


for _command in (
    run_cmd,
    bench,
    calibrate_cmd,
    costs_cmd,
    models,
    *SERVICE_COMMANDS,
    serve_cmd,
    keys_group,
    report_cmd,
):
    cli.add_command(_command)


# The commands that run the engine's matmuls; only these re-execute with OpenBLAS preloaded
# (a re-exec would double the start-up of `--version`, `--help`, `status`, `jobs`...).
ENGINE_COMMANDS = frozenset({"run", "bench", "calibrate", "costs", "worker", "models"})


def command_name(argv: list[str]) -> str | None:
    """The subcommand named in `argv` (the arguments after the program), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def main() -> None:
    if command_name(sys.argv[1:]) in ENGINE_COMMANDS:
        reexec_with_openblas()  # Linux CPU: MLX's reference BLAS swapped for OpenBLAS (~10x)
    # mlx-lm imports transformers for its tokenizers; its "PyTorch was not found" notice is noise.
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    cli()


if __name__ == "__main__":
    main()
