"""Cost of copying a 100-position prompt prefix between rows of a SmolLM2-shaped cache
(30 layers, 3 KV heads of 64) at 64 and 128 slots: `BatchKVCache.copy_prefix`.

    python bench/prefix_copy.py

Measured 2026-12-01 on the 2-core CI machine: 3.7 ms at 64 slots, 4.2 ms at 128 (before the
source was read out first, MLX copied every slot of every layer: 194 ms and 369 ms).
"""

from __future__ import annotations

import time

import mlx.core as mx

from core.engine.cache import BatchKVCache


def main() -> None:
    for slots in (64, 128):
        cache = BatchKVCache(30, slots)
        cache.reserve(250)
        for i in range(30):
            cache.keys[i] = mx.random.normal((slots, 3, cache.size, 64))
            cache.values[i] = mx.random.normal((slots, 3, cache.size, 64))
        mx.eval(cache.state())
        best = float("inf")
        for dst in range(1, 5):
            t0 = time.perf_counter()
            cache.copy_prefix(0, dst, 100)
            mx.eval(cache.state())
            best = min(best, time.perf_counter() - t0)
        print(f"{slots} slots: {1000 * best:.1f} ms per copy")


if __name__ == "__main__":
    main()
