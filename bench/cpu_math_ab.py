"""The engine with cpu_math's exp against MLX's own, side by side in one process (CPU).

    python bench/cpu_math_ab.py --items 64 --max-tokens 32

Measured 2026-12-01 on the 2-core CI machine (grounded-64, plain decoding, batch 64, the
second of two alternating rounds): 64.8 tok/s with cpu_math, 45.3 with MLX's exp.
"""

from __future__ import annotations

import argparse
import time

from core.benchmark import load_job
from core.engine import Engine, GenerationParams, cpu_math
from core.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default="examples/jobs/grounded-64.jsonl")
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    target = load_model("smollm2-135m")
    items = load_job(target, args.input, None)[: args.items]
    reqs = [(it.prompt, GenerationParams(max_tokens=args.max_tokens)) for it in items]
    ours = cpu_math.applies
    engine = Engine(target, draft="none", batch_size=len(reqs))
    engine.generate_many(reqs[:8])  # warm-up
    for _ in range(args.rounds):
        for on in (True, False):
            cpu_math.applies = ours if on else (lambda x: False)
            t0 = time.perf_counter()
            out = engine.generate_many(reqs)
            dt = time.perf_counter() - t0
            tokens = sum(len(r.tokens) for r in out)
            print(f"{'cpu_math' if on else 'mlx exp '}  {tokens / dt:6.1f} tok/s  ({dt:.1f} s)")
    cpu_math.applies = ours


if __name__ == "__main__":
    main()
