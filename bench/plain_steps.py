"""Plain steps inside a speculative engine against the plain engine's, on one job.

Each configuration runs the same 192 open prompts at batch 64 after a warm-up, with its
step parts timed (`benchmark.step_phases`). "forced plain" keeps a speculative engine in
plain steps (its step modes never try drafting), so a slower `_step_plain` there would be a
cost of the engine itself, not of interleaving drafting steps with plain ones.

    python bench/plain_steps.py [--rounds 2] [--items 192] [--batch-size 64]
"""

from __future__ import annotations

import argparse
import time

from core.benchmark import format_phases, load_job, step_phases
from core.engine import Engine, GenerationParams, draft_length
from core.models import load_model


def _plain_only(self, *args, **kwargs) -> None:
    self.mode, self._trial = "plain", None


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
    observe = draft_length.StepModes.observe
    configs = [
        ("none", "none", False),
        ("early-exit:6 forced plain", "early-exit:6", True),
        ("early-exit:6 step modes", "early-exit:6", False),
        ("ngram forced plain", "ngram", True),
    ]
    for _ in range(args.rounds):
        for label, draft, forced in configs:
            draft_length.StepModes.observe = _plain_only if forced else observe
            try:
                eng = Engine(target, draft=draft, batch_size=args.batch_size)
                eng.generate_many(reqs[: args.batch_size])  # warm-up
                with step_phases() as (sec, calls):
                    t0 = time.perf_counter()
                    res = eng.generate_many(reqs)
                    wall = time.perf_counter() - t0
            finally:
                draft_length.StepModes.observe = observe
            n = sum(len(r.tokens) for r in res)
            print(f"== {label}: {n / wall:.1f} tok/s, {wall:.2f} s", flush=True)
            for line in format_phases(sec, calls, wall)[:8]:
                print(line, flush=True)


if __name__ == "__main__":
    main()
