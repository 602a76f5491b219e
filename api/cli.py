"""The `applespec` command line."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="applespec")
def cli() -> None:
    """AppleSpec: batch LLM inference with lossless speculative decoding on MLX."""


from api.bench_cmd import bench  # noqa: E402

cli.add_command(bench)

from api.run_cmd import run_cmd  # noqa: E402
from api.service_cmds import SERVICE_COMMANDS  # noqa: E402

for _command in (run_cmd, *SERVICE_COMMANDS):
    cli.add_command(_command)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
