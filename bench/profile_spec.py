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
from collections import Counter
from contextlib import contextmanager

import mlx.core as mx

from core.engine import Engine, GenerationParams, load_model
from core.engine import generate as gen
from core.engine.benchmark import load_job

# The parts of a step timed by --phases: Batch methods, the forward's graph building, and the
# syncs (`mx.eval`; plain steps read their tokens back in `_commit_plain`).
PHASES = (
    "_admit",
    "_prefill_plan",
    "_draft",
    "_commit",
    "_commit_prefill",
    "_commit_plain",
    "_results",
)


@contextmanager
def phase_timers():
    """Wall time per phase while the block runs (nested phases count in each)."""
    seconds: Counter = Counter()
    calls: Counter = Counter()
    saved = []

    def timed(owner, name, label):
        fn = getattr(owner, name)
        saved.append((owner, name, fn))

        def wrapper(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                seconds[label] += time.perf_counter() - t0
                calls[label] += 1

        setattr(owner, name, wrapper)

    for name in PHASES:
        timed(gen.Batch, name, name)
    timed(gen, "forward", "forward (graph)")
    timed(mx, "eval", "mx.eval (sync)")
    timed(mx, "async_eval", "mx.async_eval")
    timed(gen.Batch, "_step", "_step (draft steps)")
    timed(gen.Batch, "_step_plain", "_step_plain")
    try:
        yield seconds, calls
    finally:
        for owner, name, fn in reversed(saved):
            setattr(owner, name, fn)


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
    ap.add_argument("--phases", action="store_true", help="time each part of a step, unprofiled")
    args = ap.parse_args()
    target = load_model("smollm2-135m")
    items = load_job(target, args.input, None)[: args.items]
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    engine = Engine(
        target, draft=args.draft, batch_size=args.batch_size, step_modes=not args.always_draft
    )
    engine.generate_many(reqs[: args.batch_size])  # warm-up: shapes compiled
    if args.phases:
        with phase_timers() as (seconds, calls):
            t0 = time.perf_counter()
            out = engine.generate_many(reqs)
            wall = time.perf_counter() - t0
        tokens = sum(len(r.tokens) for r in out)
        print(
            f"{args.draft} at batch {args.batch_size}: {len(out)} items, {tokens} tokens in "
            f"{wall:.2f} s ({tokens / wall:.1f} tok/s)"
        )
        print(f"{'phase':24s} {'calls':>7s} {'seconds':>8s} {'share':>6s} {'ms/call':>8s}")
        for label, sec in seconds.most_common():
            print(
                f"{label:24s} {calls[label]:7d} {sec:8.2f} {sec / wall:6.1%} "
                f"{1000 * sec / calls[label]:8.2f}"
            )
        return
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    out = engine.generate_many(reqs)
    prof.disable()
    wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in out)
    print(f"{args.draft} at batch {args.batch_size}: {tokens} tokens in {wall:.2f} s")
    for key in ("tottime", "cumulative"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(25)
        print(s.getvalue()[-6000:])


if __name__ == "__main__":
    main()
