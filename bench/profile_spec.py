"""Where a speculative batched step spends its host time: cProfile over a job run at one
batch size with one drafter (the top functions by own time and by cumulative time), or with
`--phases` the wall time of each part of a step, unprofiled (the device's work shows as the
waits at the syncs).

    python bench/profile_spec.py --input examples/jobs/grounded-256.jsonl --batch-size 256 --draft auto
    python bench/profile_spec.py --input labeling-1024.jsonl --items 1024 --draft suffix --phases
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from contextlib import nullcontext

from core.benchmark import format_phases, load_job
from core.engine import Engine, GenerationParams
from core.engine.observer import PhaseTotals
from core.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default="examples/jobs/grounded-256.jsonl")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--draft", default="auto")
    ap.add_argument("--items", type=int, default=256)
    ap.add_argument(
        "--always-draft",
        action="store_true",
        help="every step drafts (no plain steps chosen by the step-mode trials)",
    )
    ap.add_argument("--k", type=int, help="a fixed draft length per row (every step drafts)")
    ap.add_argument("--phases", action="store_true", help="time each part of a step, unprofiled")
    args = ap.parse_args()
    target = load_model("smollm2-135m")
    items = load_job(target, args.input, None)[: args.items]
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    engine = Engine(
        target,
        draft=args.draft,
        batch_size=args.batch_size,
        step_modes=not args.always_draft,
        k=args.k,
    )
    engine.generate_many(reqs[: args.batch_size])  # warm-up: shapes compiled
    prof = cProfile.Profile()
    timers = PhaseTotals()
    if args.phases:
        engine.observers.append(timers)
    with nullcontext() if args.phases else prof:
        t0 = time.perf_counter()
        out = engine.generate_many(reqs)
        wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in out)
    print(
        f"{args.draft} at batch {args.batch_size}: {len(out)} items, {tokens} tokens in "
        f"{wall:.2f} s ({tokens / wall:.1f} tok/s)"
    )
    if args.phases:
        print("\n".join(format_phases(timers.seconds, timers.calls, wall)))
        return
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(25)
        print(s.getvalue()[-6000:])


if __name__ == "__main__":
    main()
