"""Verify-step latency as key lengths change: exact attention reads vs padded ones.

MLX's CUDA backend runs attention over several queries through cuDNN graphs built per exact
shape (and cached, LRU, 128 entries), so a new key length (every speculative step) or a new
query count (every distinct prompt length a prefill meets) can pay a graph build. The
batched cache (core/engine/cache.py) pads reads to a multiple of `kv_pad()` positions and
the scorer pads long query counts the same way, so both change once per 64 positions.

Prints, per configuration, the median and mean ms of (a) verify steps of `--width` tokens
that keep 2 per step (the length grows by 2), over new lengths and then the same lengths
again; (b) prefills of `--prompts` prompts of distinct lengths, followed by the decode
steps again (do the prefills evict the decode graphs?).

    python bench/attention_lengths.py --model smollm2-135m
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402

from core.engine.cache import BatchKVCache  # noqa: E402
from core.engine.scorer import Segment, forward  # noqa: E402
from core.models.loading import load_model  # noqa: E402


def _ms(fn) -> float:
    t0 = time.perf_counter()
    mx.eval(fn())
    return 1000 * (time.perf_counter() - t0)


def decode_ms(model, cache, width: int, steps: int, context: int) -> list[float]:
    cache.lengths[0] = context
    times = []
    for i in range(steps):
        seg = Segment([0], [[i % 100 + 1] * width])
        times.append(_ms(lambda seg=seg: forward(model, cache, [seg])))
        cache.lengths[0] += min(2, width)
    return times


def prefill_ms(model, cache, prompts: int, base: int) -> list[float]:
    times = []
    for n in range(prompts):
        cache.lengths[0] = 0
        seg = Segment([0], [[7] * (base + n)], logits="last")
        times.append(_ms(lambda seg=seg: forward(model, cache, [seg])))
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--prompts", type=int, default=160)
    args = ap.parse_args()
    target = load_model(args.model)
    model, layers = target.model, target.num_layers
    print(f"{target.name} ({target.weight_format}) on {mx.default_device()}")
    print(
        f"{'width':>5} {'pad':>4} {'new: median':>12} {'mean':>8} {'seen: median':>13} "
        f"{'mean':>8} {'prefills: median':>17} {'mean':>8} {'after: median':>14} {'mean':>8}"
    )
    for width in (1, 4, 8):
        for pad in (0, 64):
            cache = BatchKVCache(layers, 1, pad=pad)
            new = decode_ms(model, cache, width, args.steps, args.context)
            seen = decode_ms(model, cache, width, args.steps, args.context)
            pre = prefill_ms(model, cache, args.prompts, 20)
            after = decode_ms(model, cache, width, args.steps, args.context)
            cells = [
                f"{statistics.median(t):>{w}.2f} {statistics.fmean(t):>8.2f}"
                for t, w in ((new, 12), (seen, 13), (pre, 17), (after, 14))
            ]
            print(f"{width:>5} {pad:>4} " + " ".join(cells), flush=True)


if __name__ == "__main__":
    main()
