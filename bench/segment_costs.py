"""What one drafting row costs a full batch on this machine: a forward of 64 rows at one
token each, against 63 rows at one token plus one row at W tokens (its own segment), and
against every row at W tokens (ms, best of 4); then 16 scattered rows of two tokens beside 48
of one, in one segment and in two.

    python bench/segment_costs.py
"""

import time

import mlx.core as mx
import numpy as np

from core.engine.cache import BatchKVCache
from core.engine.scorer import Segment, forward
from core.models import load_model

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

# A step whose rows split into segments by node count: 16 scattered rows of two nodes beside
# 48 of one, in one segment (padded to two queries a row) and in two (each segment gathers
# its rows' keys and values and runs its own attention; scorer.merge_widths).
two = [0, 5, 9, 14, 17, 22, 26, 30, 34, 37, 40, 42, 44, 46, 47, 48]
ones = [r for r in rows if r not in two]
sizes = [[5, 6] if r in two else [5] for r in rows]
print("48xW1 + 16xW2, one segment", t([Segment(rows, sizes)]))
print(
    "48xW1 + 16xW2, two segments",
    t([Segment(ones, [[5]] * len(ones)), Segment(two, [[5, 6]] * len(two))]),
)
print("48xW1 + 16xW1, two segments", t([Segment(ones, [[5]] * len(ones)), Segment(two, one[:16])]))
