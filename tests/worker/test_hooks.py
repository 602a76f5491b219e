"""Per-item hooks (worker/hooks.py): none in production, tests install theirs."""

from __future__ import annotations

import subprocess

from tests.support import hooked_cli
from tests.worker.service import ROOT
from worker import hooks


def test_no_hooks_no_callable():
    assert hooks.item_hook("c0") is None


def test_installed_hooks_run_in_order_with_the_custom_id():
    seen = []
    first, second = (lambda c: seen.append(("a", c))), (lambda c: seen.append(("b", c)))
    hooks.install(first)
    hooks.install(second)
    try:
        hooks.item_hook("c7")()
    finally:
        hooks.uninstall(first)
        hooks.uninstall(second)
    assert seen == [("a", "c7"), ("b", "c7")]
    assert hooks.item_hook("c7") is None


def test_the_launcher_runs_the_real_command_line():
    cmd = hooked_cli.command("--version", crash="x,y", item_delay=0.5)
    assert cmd[3:] == ["--crash-on", "x,y", "--item-delay", "0.5", "--", "--version"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "applespec" in out.stdout.lower(), out.stderr
