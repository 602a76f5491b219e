"""Plain steps inside a speculative engine against the plain engine's, on one job.

Each configuration runs the same 192 open prompts at batch 64 after a warm-up, with its
step parts timed (`benchmark.step_phases`). "forced plain" keeps a speculative engine in
plain steps (its step modes never try drafting), so a slower `_step_plain` there would be a
cost of the engine itself, not of interleaving drafting steps with plain ones. "step modes"
is the engine as it runs; "every move" tries drafting again at each halving of the live
rows whatever the cost surface says (`StepModes` before its `price`).

    python bench/plain_steps.py [--rounds 2] [--items 192] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import time

from core.engine import Engine, GenerationParams, draft_length, load_model
from core.engine.benchmark import format_phases, load_job, step_phases


def _plain_only(self, *args, **kwargs) -> None:
    self.mode, self._trial = "plain", None


def _every_move(self, rows: int) -> bool:
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="examples/jobs/open-256.jsonl")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--items", type=int, default=192)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    target = load_model(args.model)
    items = load_job(target, args.data, None)[: args.items]
    reqs = [(it.prompt, GenerationParams(max_tokens=96)) for it in items]
    modes = draft_length.StepModes
    observe, may_turn = modes.observe, modes._may_turn
    configs = [
        ("none", "none", None),
        ("early-exit:6 forced plain", "early-exit:6", "forced"),
        ("early-exit:6 step modes", "early-exit:6", None),
        ("early-exit:6 every move", "early-exit:6", "every"),
        ("ngram forced plain", "ngram", "forced"),
        ("ngram step modes", "ngram", None),
        ("ngram every move", "ngram", "every"),
    ]
    for _ in range(args.rounds):
        for label, draft, how in configs:
            modes.observe = _plain_only if how == "forced" else observe
            modes._may_turn = _every_move if how == "every" else may_turn
            try:
                eng = Engine(target, draft=draft, batch_size=args.batch_size)
                eng.generate_many(reqs[: args.batch_size])  # warm-up
                with step_phases() as (sec, calls):
                    t0 = time.perf_counter()
                    res = eng.generate_many(reqs)
                    wall = time.perf_counter() - t0
            finally:
                modes.observe, modes._may_turn = observe, may_turn
            n = sum(len(r.tokens) for r in res)
            drafted = sum((r.speculative or {}).get("draft_tokens", 0) for r in res)
            print(
                f"== {label}: {n / wall:.1f} tok/s, {wall:.2f} s, {drafted} draft tokens",
                flush=True,
            )
            for line in format_phases(sec, calls, wall)[:8]:
                print(line, flush=True)


if __name__ == "__main__":
    main()
