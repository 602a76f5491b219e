"""Verify-step latency as the cache grows: mlx-lm's cache vs padded attention reads.

A speculative decoder verifies a few tokens at a new key length nearly every step. MLX's
CUDA backend runs multi-query attention through cuDNN graphs built per exact key length
(and cached, LRU, 128 entries), so each new length can pay a graph build; with the reads
padded to a multiple of 64 (`core/engine/forward.py`, `kv_pad`) the length changes once per
64 positions. Prints, per configuration, the median and mean ms of a verify step over
`--steps` steps that each keep 2 of `--width` tokens (the length grows by 2 per step), then
the same steps again (every length seen once before).

    python bench/attention_lengths.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from core.engine.forward import forward, make_cache, trim  # noqa: E402
from core.engine.loading import load_model  # noqa: E402


def steps_ms(model, pad: int, width: int, steps: int, context: int) -> tuple[list, list]:
    os.environ["APPLESPEC_KV_PAD"] = str(pad)
    out = []
    for _ in range(2):  # first pass: new lengths; second: the same lengths again
        cache = make_cache(model)
        mx.eval(forward(model, mx.zeros((1, context), mx.int32), cache))
        times = []
        for i in range(steps):
            toks = mx.full((1, width), i % 100 + 1, mx.int32)
            t0 = time.perf_counter()
            mx.eval(forward(model, toks, cache))
            times.append(1000 * (time.perf_counter() - t0))
            trim(cache, width - min(2, width))
        out.append(times)
    return out[0], out[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--context", type=int, default=200)
    args = ap.parse_args()
    target = load_model(args.model)
    print(f"{target.name} ({target.weight_format}) on {mx.default_device()}")
    print(
        f"{'width':>5} {'pad':>4} {'new lengths: median':>20} {'mean':>8} "
        f"{'seen lengths: median':>21} {'mean':>8}"
    )
    for width in (1, 4, 8):
        for pad in (0, 64):
            if width == 1 and pad:
                continue  # single-token reads are never padded
            new, seen = steps_ms(target.model, pad, width, args.steps, args.context)
            print(
                f"{width:>5} {pad:>4} {statistics.median(new):>20.2f} "
                f"{statistics.fmean(new):>8.2f} {statistics.median(seen):>21.2f} "
                f"{statistics.fmean(seen):>8.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
