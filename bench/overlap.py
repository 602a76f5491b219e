"""What overlapping host work with device work saves, measured side by side.

Two switches of the engine, each run on and off on the same job in one process, alternating
(on, off, off, on) so drift on a shared machine falls on both:

- `pipeline`: plain decoding queues each step before reading the previous one back
  (mlx-lm's double buffering) instead of syncing every step;
- `overlap`: speculative steps build the previous step's finished results while the device
  runs the current forward, instead of after the sync.

    python bench/overlap.py --input examples/jobs/grounded-64.jsonl --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.benchmark import load_job  # noqa: E402
from core.engine import Engine, GenerationParams  # noqa: E402
from core.models import load_model  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--input", default="examples/jobs/grounded-64.jsonl")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--draft", default="auto")
    args = ap.parse_args()
    target = load_model(args.model)
    items = load_job(target, args.input, args.max_tokens)
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    base = Engine(target, draft="none")
    surface = base.surface
    results: dict[str, list[float]] = {}
    configs = [
        ("none pipeline=on", dict(draft="none", pipeline=True)),
        ("none pipeline=off", dict(draft="none", pipeline=False)),
        # every step drafts (no plain steps chosen by wall time): the overlap is measured
        (f"{args.draft} overlap=on", dict(draft=args.draft, overlap=True, step_modes=False)),
        (f"{args.draft} overlap=off", dict(draft=args.draft, overlap=False, step_modes=False)),
    ]
    engines = {
        name: Engine(target, surface=surface, batch_size=args.batch_size, **kw)
        for name, kw in configs
    }
    for eng in engines.values():  # first shapes, untimed
        eng.generate_many(reqs[:2])
    order = [
        configs[0],
        configs[1],
        configs[1],
        configs[0],
        configs[2],
        configs[3],
        configs[3],
        configs[2],
    ]
    for name, _ in order:
        eng = engines[name]
        eng.acceptance = {}
        t0 = time.perf_counter()
        res = eng.generate_many(reqs)
        dt = time.perf_counter() - t0
        results.setdefault(name, []).append(sum(len(r.tokens) for r in res) / dt)
        print(f"{name:<22} {results[name][-1]:8.2f} tok/s", flush=True)
    summary = {name: sum(v) / len(v) for name, v in results.items()}
    names = list(summary)
    print(
        json.dumps(
            {
                "tokens_per_s": summary,
                "pipeline_gain": summary[names[0]] / summary[names[1]],
                "overlap_gain": summary[names[2]] / summary[names[3]],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
