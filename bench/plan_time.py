"""Host time of one segment's plan (`scorer._plan`: positions, mask, packing) at decode and
prefill shapes, the work a batched step does before the device starts. Run it at two commits
to compare them.

    PYTHONPATH=. python bench/plan_time.py
"""

from __future__ import annotations

import time

import numpy as np

from core.engine import scorer
from core.engine.cache import BatchKVCache

SHAPES = (  # (rows, nodes per row, tree)
    (64, 1, False),
    (64, 4, False),
    (256, 1, False),
    (64, 6, True),
    (16, 300, False),
)


def main(repeat: int = 50) -> None:
    rng = np.random.default_rng(0)
    for rows, nodes, tree in SHAPES:
        cache = BatchKVCache(1, rows, pad=0)
        cache.lengths[:] = rng.integers(300, 600, rows)
        parents = [[-1] + [(j - 1) // 2 for j in range(1, nodes)]] * rows if tree else None
        seg = scorer.Segment(list(range(rows)), [[1] * nodes] * rows, parents=parents)
        scorer._plan(cache, seg, 0)
        t0 = time.perf_counter()
        for _ in range(repeat):
            scorer._plan(cache, seg, 0)
        ms = 1e3 * (time.perf_counter() - t0) / repeat
        kind = "tree" if tree else "chain"
        print(f"{rows:4d} rows x {nodes:3d} nodes ({kind}): {ms:6.2f} ms")


if __name__ == "__main__":
    main()
