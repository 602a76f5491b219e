"""What one drafting row costs a full batch on this machine: a forward of 64 rows at one
token each, against 63 rows at one token plus one row at W tokens (its own segment), and
against every row at W tokens (ms, best of 4).

    python bench/segment_costs.py
"""

import time

import mlx.core as mx
import numpy as np

from core.engine import load_model
from core.engine.cache import BatchKVCache
from core.engine.scorer import Segment, forward

m = load_model("smollm2-135m").model
b, ctx = 64, 160
cache = BatchKVCache(len(m.model.layers), b)
rows = list(range(b))
pre = np.random.default_rng(0).integers(0, 1000, (b, ctx)).tolist()
mx.eval(forward(m, cache, [Segment(rows, pre, logits="none")]))
cache.lengths[:] = ctx


def t(segs, n=4):
    mx.eval(forward(m, cache, segs))
    best = 9
    for _ in range(n):
        t0 = time.perf_counter()
        mx.eval(forward(m, cache, segs))
        best = min(best, time.perf_counter() - t0)
    return best * 1000


one = [[5]] * b
print("all W1", t([Segment(rows, one)]))
for w in (2, 4, 8):
    print(
        f"63xW1 + 1xW{w}", t([Segment(rows[:63], one[:63]), Segment([63], [list(range(5, 5 + w))])])
    )
    print(f"all W{w}", t([Segment(rows, [list(range(5, 5 + w))] * b)]))
print("60xW1 + 4xW4", t([Segment(rows[:60], one[:60]), Segment(rows[60:], [[5, 6, 7, 8]] * 4)]))
