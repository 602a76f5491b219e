"""The OpenBLAS re-exec decision and its effect on a real `applespec` process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from api import blas


@pytest.fixture
def lib(monkeypatch, tmp_path):
    fake = tmp_path / "libopenblas.so.0"
    fake.write_bytes(b"")
    monkeypatch.setattr(blas, "OPENBLAS", fake)
    monkeypatch.setattr(blas.sys, "platform", "linux")
    return str(fake)


def test_preload_env_adds_the_library_and_a_marker(lib, monkeypatch):
    monkeypatch.setattr(blas, "cpu_flags", lambda: set())
    env = blas.preload_env({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "LD_PRELOAD": lib, blas.MARKER: "1"}
    env = blas.preload_env({"LD_PRELOAD": "/x/libfoo.so"})
    assert env["LD_PRELOAD"] == f"{lib}:/x/libfoo.so"


def test_preload_env_picks_the_kernels_from_the_cpu_flags(lib, monkeypatch):
    monkeypatch.setattr(blas, "cpu_flags", lambda: {"avx2", "fma", "sse3"})
    assert blas.preload_env({})[blas.CORETYPE] == "Haswell"
    # an operator's own choice is kept
    assert blas.preload_env({blas.CORETYPE: "Zen"})[blas.CORETYPE] == "Zen"


@pytest.mark.parametrize(
    "flags, want",
    [
        ("fpu sse sse2 pni", None),
        ("sse3 avx avx2 fma", "Haswell"),
        ("avx2 fma avx512f avx512bw avx512dq avx512vl", "SkylakeX"),
        ("avx2 fma avx512f avx512bw avx512dq avx512vl avx512_bf16 amx_tile", "Cooperlake"),
    ],
)
def test_coretype_from_cpuinfo(flags, want):
    cpuinfo = f"processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: {flags}\n"
    assert blas.coretype(blas.cpu_flags(cpuinfo)) == want


@pytest.mark.parametrize(
    "env",
    [
        {blas.OPT_OUT: "1"},
        {blas.MARKER: "1"},  # the re-executed process never re-executes again
        {"LD_PRELOAD": "/y/libbar.so:{lib}"},
    ],
)
def test_no_reexec(lib, env):
    env = {k: v.format(lib=lib) for k, v in env.items()}
    assert blas.preload_env(env) is None


def test_no_library_no_reexec(monkeypatch, tmp_path):
    monkeypatch.setattr(blas, "OPENBLAS", tmp_path / "missing.so")
    assert blas.preload_env({}) is None


@pytest.mark.skipif(not blas.OPENBLAS.exists(), reason="libopenblas0-pthread is not installed")
@pytest.mark.parametrize("opt_out, expected", [(None, "OpenBLAS (preloaded, "), ("1", "reference")])
def test_cli_process_maps_openblas(opt_out, expected):
    drop = ("LD_PRELOAD", blas.MARKER, blas.OPT_OUT, blas.CORETYPE)
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if opt_out:
        env[blas.OPT_OUT] = opt_out
    out = subprocess.run(
        [sys.executable, "-m", "api.cli", "models", "--verbose"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"BLAS: {expected}" in out
    if not opt_out and (core := blas.coretype(blas.cpu_flags())):
        assert f"{core} kernels" in out  # the re-exec chose the kernels from the CPU flags
