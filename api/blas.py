"""OpenBLAS preload for MLX's Linux CPU backend.

MLX's Linux CPU wheel links the reference BLAS; Debian's OpenBLAS (package
`libopenblas0-pthread`) provides the same symbols and makes float32 matmuls ~10x faster.
The dynamic loader only swaps it in at process start, so `main()` re-executes the
command once with `LD_PRELOAD` set (the environment passes it on to workers it spawns).

Debian's OpenBLAS (0.3.21) picks its kernels from the CPU model; a CPU it does not know (a
virtual machine reporting a generic "Intel Xeon Processor", as this project's CI does) gets
the Prescott kernels, SSE3 only: measured on such a 2-core machine with AVX-512, a
(32, 576) @ (576, 49152) float32 matmul ran at 21 GFLOP/s with Prescott and 110 GFLOP/s
with Cooperlake's, and mlx-lm's batched generation 3x faster. So the re-exec also sets
`OPENBLAS_CORETYPE` from the CPU's own feature flags, unless the environment already does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

OPENBLAS = Path("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0")
OPT_OUT = "APPLESPEC_NO_OPENBLAS"
MARKER = "APPLESPEC_OPENBLAS_REEXEC"  # set in the re-executed process: never loop
CORETYPE = "OPENBLAS_CORETYPE"
# OpenBLAS kernel families by the instruction-set flags they need, widest first.
CORETYPES = (
    ("Cooperlake", {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}),
    ("SkylakeX", {"avx512f", "avx512bw", "avx512dq", "avx512vl"}),
    ("Haswell", {"avx2", "fma"}),
)


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The instruction-set flags of this CPU as the kernel reports them (/proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def coretype(flags: set[str]) -> str | None:
    """The widest OpenBLAS kernel family whose instructions the CPU has (None: leave it)."""
    return next((name for name, need in CORETYPES if need <= flags), None)


def openblas_path() -> Path | None:
    """The OpenBLAS library to preload, or None where there is none (or not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    return OPENBLAS if OPENBLAS.exists() else None


def preload_env(env: Mapping[str, str]) -> dict[str, str] | None:
    """The environment to re-execute with, or None when no re-exec is wanted.

    None when: not Linux or no OpenBLAS, `APPLESPEC_NO_OPENBLAS` is set, LD_PRELOAD
    already names it, or this process is already the re-executed one.
    """
    lib = openblas_path()
    if lib is None or env.get(OPT_OUT) or env.get(MARKER):
        return None
    preload = env.get("LD_PRELOAD", "")
    if str(lib) in preload.split(":") or str(lib.resolve()) in preload.split(":"):
        return None
    new = dict(env)
    new["LD_PRELOAD"] = f"{lib}:{preload}" if preload else str(lib)
    new[MARKER] = "1"
    if not env.get(CORETYPE) and (core := coretype(cpu_flags())):
        new[CORETYPE] = core
    return new


def reexec_with_openblas() -> None:
    """Replace this process with the same command and OpenBLAS preloaded, when wanted.

    Returns only when no re-exec is wanted (see `preload_env`).
    """
    env = preload_env(os.environ)
    if env is None:
        return
    # orig_argv keeps the interpreter's own flags (`python -m api.cli ...`).
    os.execve(sys.executable, list(sys.orig_argv), env)


def blas_status() -> str:
    """One line for `--verbose` output: which BLAS this process has mapped."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return "BLAS: unknown (no /proc/self/maps)"
    if "libopenblas" in maps:
        return f"BLAS: OpenBLAS (preloaded, {openblas_core() or 'unknown'} kernels)"
    if os.environ.get(OPT_OUT):
        return f"BLAS: reference (OpenBLAS disabled by {OPT_OUT})"
    if openblas_path() is None:
        return "BLAS: reference (install libopenblas0-pthread for ~10x faster CPU matmuls)"
    return "BLAS: reference"


def openblas_core() -> str | None:
    """The kernel family the loaded OpenBLAS runs (`openblas_get_corename`), if loaded."""
    import ctypes

    try:
        fn = ctypes.CDLL(None).openblas_get_corename
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_char_p
    return fn().decode()


_MATMUL = """
import time, mlx.core as mx
a = mx.random.normal((16, 576)); b = mx.random.normal((576, 49152)); mx.eval(a, b)
for _ in range(3): mx.eval(a @ b)
t = time.perf_counter()
for _ in range(20): mx.eval(a @ b)
print((time.perf_counter() - t) / 20)
"""


def measure() -> tuple[float, float]:
    """Seconds per (16, 576) @ (576, 49152) float32 matmul: `(reference, openblas)`.

    Each runs in a fresh interpreter, since the BLAS is picked at process start.
    """
    import subprocess

    lib = openblas_path()
    if lib is None:
        raise RuntimeError("no OpenBLAS to measure (Linux with libopenblas0-pthread only)")
    base = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", MARKER)}
    times = []
    for preload in (None, str(lib)):
        env = dict(base, LD_PRELOAD=preload) if preload else base
        out = subprocess.run(
            [sys.executable, "-c", _MATMUL], env=env, capture_output=True, text=True, check=True
        )
        times.append(float(out.stdout.strip()))
    return times[0], times[1]


if __name__ == "__main__":
    if sys.argv[1:] == ["--coretype"]:  # for the Makefile: the value to export, or nothing
        print(os.environ.get(CORETYPE) or coretype(cpu_flags()) or "")
        sys.exit(0)
    ref, fast = measure()
    print(f"16x576 @ 576x49152 float32: reference BLAS {ref * 1e3:.1f} ms, ", end="")
    print(f"OpenBLAS {fast * 1e3:.1f} ms, {ref / fast:.1f}x")
