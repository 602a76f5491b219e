"""`applespec --version`, `--help`, `status` and `jobs` answer without the engine.

The mechanism, not a time: a subprocess runs the command through `main()` (the console
script's entry point) and reports which modules it imported and whether it re-executed
itself (the OpenBLAS preload that only engine commands need).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.worker.service import ROOT

HEAVY = ("mlx", "mlx_lm", "transformers", "core.engine", "celery", "fastapi")

PROBE = """
import json, os, sys
from api import blas
from api.cli import main
execs = []
os.execve = lambda *a: execs.append(a[1])  # a re-exec would start the process over
sys.argv = ["applespec", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
heavy = sorted({m for m in sys.modules for h in HEAVY if m == h or m.startswith(h + ".")})
print(json.dumps({"heavy": heavy, "reexec": bool(execs)}), file=sys.stderr)
"""


def probe(*args: str) -> dict:
    env = {
        k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "APPLESPEC_OPENBLAS_REEXEC")
    }
    out = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return json.loads(out.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args", [["--version"], ["--help"], ["status", "job-x"], ["jobs"], ["submit", "--help"]]
)
def test_quick_commands_import_no_engine_and_do_not_reexec(args):
    seen = probe(*args)
    assert seen == {"heavy": [], "reexec": False}


def test_engine_commands_still_get_openblas(monkeypatch):
    from api import blas

    if blas.openblas_path() is None:
        pytest.skip("no OpenBLAS on this machine: nothing to preload")
    assert probe("models", "--json")["reexec"] is True
