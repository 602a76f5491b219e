"""A job whose self-drafter learns while it runs (core/training/online.py): acceptance
of its first and last items, the curve against each item's place in the finish order, the
versions swapped in and the share of the wall time spent learning.

The self-drafter starts untrained (an adapter: a copy of layer L; with `--draft head` a new
feature head; nothing stored: a fresh APPLESPEC_HOME) unless --keep-home. A fixed draft length (--k) and no step-mode switching keep every row
drafting, so acceptance is measured on every item; the target's greedy output is checked
against plain decoding of the same items with --check.

    python bench/online_learning.py --data examples/jobs/open-256.jsonl --items 200 \
        --layer 6 --share 0.1 -o bench/results/cpu-online-open-200.json
    python bench/online_learning.py --data examples/jobs/open-256.jsonl --items 200 \
        --draft head --share 0.1
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from core.benchmark import load_job
from core.engine import Engine, GenerationParams
from core.models import load_model
from core.training.online import learner_factory


def acceptance(results) -> float | None:
    drafted = sum(r.speculative["draft_tokens"] for r in results)
    accepted = sum(r.speculative["accepted_tokens"] for r in results)
    return round(accepted / drafted, 4) if drafted else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--items", type=int, default=200)
    ap.add_argument("--layer", type=int, default=6)
    ap.add_argument("--draft", default=None, help="the drafter (default adapter:LAYER; head)")
    ap.add_argument("--share", type=float, default=0.1)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--edge", type=int, default=50, help="items in the first and last groups")
    ap.add_argument("--check", action="store_true", help="compare with plain decoding")
    ap.add_argument("--keep-home", action="store_true", help="start from a stored adapter")
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    if not args.keep_home:
        os.environ["APPLESPEC_HOME"] = tempfile.mkdtemp(prefix="applespec-online-")
    target = load_model(args.model)
    items = load_job(target, args.data, None)[: args.items]
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    engine = Engine(
        target,
        draft=args.draft or f"adapter:{args.layer}",
        k=args.k,
        batch_size=args.batch_size,
        step_modes=False,
        learner=learner_factory(args.share),
    )
    done = []
    t0 = time.perf_counter()

    def finished(r) -> None:
        done.append(r)
        if len(done) % 25 == 0:
            lr = engine.learner
            print(
                f"{len(done)} items, acceptance of the last 25 {acceptance(done[-25:])}, "
                f"version {lr.version}, {lr.steps} steps, learning {lr.spent:.0f} s of "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )

    results = engine.generate_many(reqs, on_result=finished)
    # A prompt the job held before (open jobs repeat some): its answer may be memorised.
    first_seen: dict[tuple, int] = {}
    for i, it in enumerate(items):
        first_seen.setdefault(tuple(it.prompt), i)
    new = {r.tag for r in done if first_seen[tuple(items[r.tag].prompt)] == r.tag}
    wall = time.perf_counter() - t0
    learner = engine.learner
    tokens = sum(len(r.tokens) for r in results)
    out = {
        "model": target.name,
        "data": args.data,
        "items": len(items),
        "draft": args.draft or f"adapter:{args.layer}",
        "k": args.k,
        "batch_size": args.batch_size,
        "share": args.share,
        "tokens": tokens,
        "wall_s": round(wall, 1),
        "tokens_per_s": round(tokens / wall, 2),
        "learning_s": round(learner.spent, 1),
        "learning_share": round(learner.spent / wall, 4),
        "versions": learner.version,
        "training_steps": learner.steps,
        "trained_positions": learner.trained,
        f"acceptance_first_{args.edge}": acceptance(done[: args.edge]),
        f"acceptance_last_{args.edge}": acceptance(done[-args.edge :]),
        "distinct_prompts": len(first_seen),
        f"acceptance_last_{args.edge}_new_prompts": acceptance(
            [r for r in done[-args.edge :] if r.tag in new]
        ),
        f"new_prompts_in_last_{args.edge}": sum(r.tag in new for r in done[-args.edge :]),
        "acceptance_curve": [
            {"items": i + 25, "acceptance": acceptance(done[i : i + 25])}
            for i in range(0, len(done), 25)
        ],
        "version_by_item": [r.speculative.get("adapter_version") for r in done],
        "history": learner.history,
    }
    if args.check:
        plain = Engine(target, draft="none", batch_size=args.batch_size).generate_many(reqs)
        out["identical_to_plain"] = [r.tokens for r in results] == [r.tokens for r in plain]
    text = json.dumps(out, indent=1)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n")


if __name__ == "__main__":
    main()
