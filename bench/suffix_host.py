"""Host time of suffix drafting per row proposal, apart from any forward: the job's first
`--history` answers (plain greedy) are indexed as finished, then `--rows` later items are
replayed token by token, every row asking for `--k` tokens at every position.

    python examples/make_jobs.py --kind labeling --items 192 -o labeling-192.jsonl
    python bench/suffix_host.py --input labeling-192.jsonl --history 128 --rows 64
"""

from __future__ import annotations

import argparse
import itertools
import time
from types import SimpleNamespace

from core.engine import Engine, GenerationParams, load_model
from core.engine.benchmark import load_job
from core.engine.drafters.suffix import Corpora, SuffixDrafter


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--history", type=int, default=128)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="replays; the fastest is printed")
    args = ap.parse_args()
    target = load_model(args.model)
    items = load_job(target, args.input, None)[: args.history + args.rows]
    engine = Engine(target, draft="none", batch_size=64)
    answers = engine.generate_many(
        [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    )
    uid = itertools.count()

    def seq(it):
        return SimpleNamespace(
            prompt=it.prompt, output=[], state={}, uid=next(uid), max_tokens=it.max_tokens,
            corpus="job", finish_reason=None, text_end=None,
        )  # fmt: skip

    best = None
    for _ in range(args.repeat):
        drafter = SuffixDrafter(
            SimpleNamespace(target=target, engine=SimpleNamespace(corpora=Corpora()))
        )
        for it, r in zip(items[: args.history], answers, strict=False):
            s = seq(it)
            drafter.admit(s)
            s.output, s.finish_reason = list(r.tokens), "stop"
            drafter.retire(s)
        rows = [
            (seq(it), r.tokens)
            for it, r in zip(items[args.history :], answers[args.history :], strict=True)
        ]
        for s, _ in rows:
            drafter.admit(s)
        seconds, proposals, matched, proposed = 0.0, 0, 0, 0
        for step in itertools.count(1):
            live = [(s, toks) for s, toks in rows if step <= len(toks)]
            if not live:
                break
            for s, toks in live:
                s.output = toks[:step]
            seqs = [s for s, _ in live]
            t0 = time.perf_counter()
            draft = drafter.propose(seqs, [args.k] * len(seqs))
            seconds += time.perf_counter() - t0
            proposals += len(seqs)
            for (_, toks), d in zip(live, draft.tokens, strict=True):
                future = toks[step : step + len(d)]
                matched += next(
                    (i for i, (a, b) in enumerate(zip(d, future, strict=False)) if a != b),
                    min(len(d), len(future)),
                )
                proposed += len(d)
            drafter.commit(seqs, draft, [[] for _ in seqs])
        us = 1e6 * seconds / proposals
        best = us if best is None else min(best, us)
    print(
        f"suffix drafting: {best:.0f} us per row proposal (fastest of {args.repeat}), "
        f"{proposals} proposals, {matched} of {proposed} proposed tokens match the answer"
    )


if __name__ == "__main__":
    main()
