"""The `applespec` command line."""

from __future__ import annotations

import click


@click.group()
@click.version_option(package_name="applespec")
def cli() -> None:
    """AppleSpec: batch LLM inference with lossless speculative decoding on MLX."""


from api.bench_cmd import bench  # noqa: E402

cli.add_command(bench)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
