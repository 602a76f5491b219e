"""Host and device time of one verify forward at a full batch, by how its shape varies from
step to step: where a drafting step's time goes apart from the drafter.

Every step verifies B rows after a `--context`-token prefix (the cache is not committed, so
every step sees the same lengths). Kinds of step:

- `plain`: one token per row (a plain step's shape);
- `uniform`: `--width` tokens on every row, the same shape every step (the cost surface's
  probe);
- `ragged`: 1 to 2 x `--width` - 1 tokens per row drawn afresh every step (a drafting
  step's shapes: the packed token count changes every step);
- `ragged-fixed`: the same draws, every row padded to the widest (one packed count).

Per kind: the median milliseconds building the graph (`forward` and the argmax), in
`mx.async_eval`, and waiting at the sync, and their sum.

    python bench/verify_shapes.py --batch 256 --width 4 --steps 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import mlx.core as mx
import numpy as np

from core.engine.cache import BatchKVCache
from core.engine.scorer import Segment, forward
from core.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--context", type=int, default=192)
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    target = load_model(args.model)
    model, B = target.model, args.batch
    vocab = target.vocab_size
    rng = np.random.default_rng(0)
    cache = BatchKVCache(target.num_layers, B)
    rows = list(range(B))
    prefix = rng.integers(0, vocab, (B, args.context)).tolist()
    mx.eval(forward(model, cache, [Segment(rows, prefix, logits="none")]))
    cache.lengths[:] = args.context
    static = cache.pad > 1  # CUDA: a power-of-two query count, as the engine asks there

    def widths(kind: str) -> list[int]:
        if kind == "plain":
            return [1] * B
        if kind == "uniform":
            return [args.width] * B
        w = rng.integers(1, 2 * args.width, B).tolist()
        return [max(w)] * B if kind == "ragged-fixed" else w

    print(f"{target.name} on {mx.default_device()}, batch {B}, context {args.context}")
    print(f"{'kind':<14}{'nodes':>7}{'graph ms':>10}{'async ms':>10}{'sync ms':>9}{'total':>8}")
    for kind in ("plain", "uniform", "ragged", "ragged-fixed"):
        times = []
        nodes = []
        for step in range(args.steps + 3):
            ws = widths(kind)
            toks = [rng.integers(0, vocab, w).tolist() for w in ws]
            min_w = 1 << (max(ws) - 1).bit_length() if static else 1
            t0 = time.perf_counter()
            out = forward(model, cache, [Segment(rows, toks, min_w=min_w)])[0]
            picks = mx.argmax(out, axis=-1)
            t1 = time.perf_counter()
            mx.async_eval(picks)
            t2 = time.perf_counter()
            mx.eval(picks)
            t3 = time.perf_counter()
            if step >= 3:  # the first steps of a kind meet its shapes first
                times.append((t1 - t0, t2 - t1, t3 - t2))
                nodes.append(sum(ws))
        g, a, s = (1000 * statistics.median(x) for x in zip(*times, strict=True))
        print(
            f"{kind:<14}{statistics.median(nodes):>7.0f}{g:>10.2f}{a:>10.2f}{s:>9.2f}"
            f"{g + a + s:>8.2f}"
        )


if __name__ == "__main__":
    main()
