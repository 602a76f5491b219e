"""The confidence gate on and off, drafting on every step (no step modes), against plain
decoding, in one process: tokens per second, the rows' verify steps, the draft nodes verified
and those accepted.

    python bench/gate_ab.py --input open-held-out-256.jsonl --batch-size 64 --rounds 1
"""

from __future__ import annotations

import argparse
import time

from core.benchmark import load_job
from core.engine import Engine, GenerationParams
from core.engine.draft_length import GATE_COST
from core.models import load_model

OFF = float("inf")  # no draft token costs that much: the gate is never asked


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--draft", default="head")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    target = load_model("smollm2-135m")
    items = load_job(target, args.input, None)
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    B = args.batch_size
    configs = {
        "none": dict(draft="none", gate_cost=GATE_COST),
        "gate": dict(draft=args.draft, step_modes=False, gate_cost=GATE_COST),
        "no gate": dict(draft=args.draft, step_modes=False, gate_cost=OFF),
    }
    engines = {name: Engine(target, batch_size=B, **kw) for name, kw in configs.items()}
    for engine in engines.values():  # warm-up: shapes compiled
        engine.generate_many(reqs[:B])
    rates: dict[str, list[float]] = {name: [] for name in configs}
    for r in range(args.rounds):
        for name, engine in engines.items():
            t0 = time.perf_counter()
            out = engine.generate_many(reqs)
            wall = time.perf_counter() - t0
            spec = [o.speculative for o in out]
            tokens = sum(len(o.tokens) for o in out)
            rates[name].append(tokens / wall)
            print(
                f"round {r + 1} {name}: {tokens / wall:.1f} tok/s, row steps "
                f"{sum(s['verify_steps'] for s in spec)}, nodes verified "
                f"{sum(s['draft_tokens'] for s in spec)}, accepted "
                f"{sum(s['accepted_tokens'] for s in spec)}",
                flush=True,
            )
    for name in configs:
        ratios = [a / b for a, b in zip(rates[name], rates["none"], strict=True)]
        print(f"{name}: " + " ".join(f"{x:.3f}" for x in ratios) + " x plain by round")


if __name__ == "__main__":
    main()
