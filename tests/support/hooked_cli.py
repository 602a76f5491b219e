"""`applespec` with per-item test hooks installed: the real command line (`api.cli.main`),
run exactly as production runs it, in a process whose items can crash it or run slowly.

    python -m tests.support.hooked_cli [--crash-on IDS] [--item-delay S] -- worker --model M ...

`--crash-on`: comma-separated custom_ids; the process dies (`os._exit(70)`) when it runs one
of them (the poison-item cap, an interrupted `run`). `--item-delay`: seconds each item waits
as it runs (a chunk slower than the broker's visibility timeout, a shutdown mid-chunk).
The hooks live in this process's `worker.hooks`: a prefork pool's children inherit them, and
the OpenBLAS re-exec of `api.cli.main` replays this same command line, installing them again.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from worker import hooks


def crash_on(ids: set[str]) -> hooks.ItemHook:
    def crash(custom_id: str) -> None:
        if custom_id in ids:
            os._exit(70)

    return crash


def delay(seconds: float) -> hooks.ItemHook:
    return lambda _custom_id: time.sleep(seconds)


def command(*cli_args: str, crash: str | None = None, item_delay: float | None = None) -> list:
    """The argv that runs `applespec CLI_ARGS...` through this launcher."""
    argv = [sys.executable, "-m", "tests.support.hooked_cli"]
    if crash:
        argv += ["--crash-on", crash]
    if item_delay:
        argv += ["--item-delay", str(item_delay)]
    return [*argv, "--", *cli_args]


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="hooked_cli")
    parser.add_argument("--crash-on", default="")
    parser.add_argument("--item-delay", type=float, default=0.0)
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    cli_args = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    if args.crash_on:
        hooks.install(crash_on(set(args.crash_on.split(","))))
    if args.item_delay:
        hooks.install(delay(args.item_delay))
    from api.cli import main as applespec

    sys.argv = ["applespec", *cli_args]
    applespec()


if __name__ == "__main__":
    main(sys.argv[1:])
