"""A drafter with the draft-length policy against the same drafter at fixed draft lengths,
and against another drafter, on one job in one process, in rounds (each configuration once
per round, in turn): whether the policy drafts as much as pays on this machine.

    python bench/fixed_k.py --input labeling-256.jsonl --batch-size 64 --draft suffix --ks 4,8 --against ngram
"""

from __future__ import annotations

import argparse
import time

from core.benchmark import load_job
from core.engine import Engine, GenerationParams
from core.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--draft", default="suffix")
    ap.add_argument("--ks", default="4,8", help="fixed draft lengths, comma-separated")
    ap.add_argument("--against", default="ngram", help="another drafter, with the policy")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    target = load_model(args.model)
    items = load_job(target, args.input, None)
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    configs = [(args.draft, None)] + [(args.draft, int(k)) for k in args.ks.split(",") if k]
    configs.append((args.against, None))
    engines = {c: Engine(target, draft=c[0], batch_size=args.batch_size, k=c[1]) for c in configs}
    for e in engines.values():
        e.generate_many(reqs[:2])  # first shapes
    first = None
    for rnd in range(args.rounds):
        for (draft, k), e in engines.items():
            t0 = time.perf_counter()
            out = e.generate_many(reqs)
            dt = time.perf_counter() - t0
            toks = [r.tokens for r in out]
            first = first or toks
            steps = sum(r.speculative.get("verify_steps", 0) for r in out)
            emitted = sum(
                r.speculative.get("mean_accepted_length", 0) * r.speculative.get("verify_steps", 0)
                for r in out
            )
            name = f"{draft} k={k}" if k else f"{draft} (policy)"
            print(
                f"round {rnd + 1} {name:<18} {sum(map(len, toks)) / dt:7.1f} tok/s  {dt:6.1f} s  "
                f"accepted length {emitted / max(steps, 1):.2f}  output as the first: "
                f"{toks == first}",
                flush=True,
            )


if __name__ == "__main__":
    main()
