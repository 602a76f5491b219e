"""Validate and time the tree-verification kernels against the pure-MLX reference.

    python -m kernels.bench_verify            # validate a grid, then time a few (N, V)
    python -m kernels.bench_verify --iters 50 --batch 4

On a machine without a GPU kernel (Linux CPU) only the reference is timed.
"""

from __future__ import annotations

import argparse
import time

import mlx.core as mx
import numpy as np

from .tree import VerifyResult
from .verify import draw_uniforms, verify

FIELDS = ("choice", "child", "accepted", "path", "num_accepted", "next_token")


def random_parents(n: int, rng: np.random.Generator, shape: str = "tree") -> list[int]:
    """A chain ([-1, 0, 1, ...]) or a random tree in topological order."""
    if shape == "chain":
        return [-1] + list(range(n - 1))
    return [-1] + [int(rng.integers(0, j)) for j in range(1, n)]


def make_case(B: int, N: int, V: int, dtype, mode: str, seed: int = 0, shape: str = "tree") -> dict:
    """Random logits and a tree whose tokens are often the target's choice (so paths grow).

    mode: "greedy", "sample" (deterministic drafts) or "sample_q" (tokens drawn from q).
    Built with MLX ops so it is cheap on the GPU too.
    """
    rng = np.random.default_rng(seed)
    parents = random_parents(N, rng, shape)
    par = mx.array([max(p, 0) for p in parents])  # (N,) the root points at itself (unused)
    k1, k2, k3, k4, k5 = mx.random.split(mx.random.key(seed), 5)
    lg = mx.random.normal((B, N, V), key=k1) * 3.0
    favored = mx.random.randint(0, V, (B, N), key=k2)
    if mode != "greedy":  # one clear favourite per node (most of the mass) so samples accept
        top = mx.max(lg, axis=-1, keepdims=True) + 5.0
        lg = mx.where(mx.arange(V) == favored[..., None], top, lg)
    logits = lg.astype(dtype)
    lf = logits.astype(mx.float32)  # what the kernels see after the cast
    hit = mx.random.uniform(shape=(B, N), key=k3) < 0.7
    rand = mx.random.randint(0, V, (B, N), key=k4)
    probs = None
    if mode == "greedy":
        tokens = mx.where(hit, mx.take(mx.argmax(lf, axis=-1), par, axis=1), rand)
    elif mode == "sample":
        tokens = mx.where(hit, mx.take(favored, par, axis=1), rand)
    else:
        noisy = lf + mx.random.normal((B, N, V), key=k5)
        q = mx.take(mx.softmax(noisy, axis=-1), par, axis=1)  # (B, N, V) node j ~ q[:, j]
        tokens = mx.random.categorical(mx.log(q), key=k4)
        probs = q.astype(dtype)
    return {
        "logits": logits,
        "tokens": tokens.astype(mx.int32),
        "parents": parents,
        "draft_probs": probs,
        "uniforms": None if mode == "greedy" else draw_uniforms(B, N, mx.random.key(seed)),
        "greedy": mode == "greedy",
    }


def mismatches(a: VerifyResult, b: VerifyResult) -> dict[str, int]:
    """Entries that differ, per output field."""
    return {f: int(mx.sum(getattr(a, f) != getattr(b, f)).item()) for f in FIELDS}


def _time(fn, iters: int) -> float:
    for _ in range(3):
        mx.eval(*_outs(fn()))
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        mx.eval(*_outs(fn()))
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def _outs(r: VerifyResult) -> list[mx.array]:
    return [getattr(r, f) for f in FIELDS]


def kernel_backend() -> str | None:
    from . import verify_cuda, verify_metal

    if verify_cuda.available():
        return "cuda"
    if verify_metal.available():
        return "metal"
    return None


def validate(backend: str) -> int:
    """Kernel vs reference over a grid; prints one line per case, returns failing cases."""
    bad = 0
    for dtype in (mx.float32, mx.float16, mx.bfloat16):
        for N, shape in ((1, "tree"), (6, "tree"), (16, "chain"), (40, "tree")):
            for V in (7, 1000, 49152, 151936):
                for mode in ("greedy", "sample", "sample_q"):
                    case = make_case(4, N, V, dtype, mode, seed=N * 31 + V % 97, shape=shape)
                    ref = verify(**case, backend="ops")
                    ker = verify(**case, backend=backend)
                    mm = mismatches(ref, ker)
                    if any(mm.values()):
                        bad += 1
                        print(f"MISMATCH {dtype} N={N} V={V} {mode}: {mm}")
    print(f"validate[{backend}]: {bad} failing cases of {3 * 4 * 4 * 3}")
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--no-validate", action="store_true")
    args = ap.parse_args()
    backend = kernel_backend()
    print(f"device: {mx.default_device()}, kernel backend: {backend or 'none (reference only)'}")
    if backend and not args.no_validate:
        validate(backend)
    print(
        f"{'mode':8} {'N':>4} {'V':>7} {'B':>3} {'reference ms':>13} {'kernel ms':>10} {'speedup':>8}"
    )
    for mode in ("greedy", "sample", "sample_q"):
        for N, V in ((8, 49152), (32, 49152), (64, 49152), (32, 151936), (64, 151936)):
            case = make_case(args.batch, N, V, mx.float16, mode, seed=1)
            t_ref = _time(lambda c=case: verify(**c, backend="ops"), args.iters)
            line = f"{mode:8} {N:>4} {V:>7} {args.batch:>3} {t_ref * 1e3:>13.3f}"
            if backend:
                t_k = _time(lambda c=case: verify(**c, backend=backend), args.iters)
                line += f" {t_k * 1e3:>10.3f} {t_ref / t_k:>7.1f}x"
            print(line, flush=True)


if __name__ == "__main__":
    main()
