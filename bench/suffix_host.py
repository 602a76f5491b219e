"""Host time of suffix drafting per row proposal, apart from any forward: the job's first
`--history` answers (plain greedy) are indexed as finished, then `--rows` later items are
replayed, every row asking for `--k` tokens at every step. A row then moves on by as many
tokens as greedy verification would keep: the proposed tokens its own answer goes on with,
and one more (`--advance one`: one token per step, every position asked once).

`--against OTHER/suffix.py` times another version of the drafter (a worktree of an earlier
commit) in the same process, replays alternating: on a shared machine only that ratio is
worth reading.

    python examples/make_jobs.py --kind labeling --items 384 -o labeling-384.jsonl
    python bench/suffix_host.py --input labeling-384.jsonl --history 128 --rows 256 --k 16
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import itertools
import json
import pstats
import statistics
import time
from pathlib import Path
from types import SimpleNamespace

from core.benchmark import load_job
from core.engine import Engine, GenerationParams
from core.engine.drafters import suffix
from core.models import load_model


def load_other(path: str):
    """Another version of `core/engine/drafters/suffix.py`, as a module of this package (its
    relative imports resolve here)."""
    spec = importlib.util.spec_from_file_location("core.engine.drafters._other_suffix", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def replay(module, target, items, answers, args, prof=None) -> tuple[float, int, int, int]:
    """One replay with `module`'s drafter: (seconds proposing, proposals, matched, proposed)."""
    uid = itertools.count()

    def seq(it):
        return SimpleNamespace(
            prompt=it.prompt, output=[], state={}, uid=next(uid), max_tokens=it.max_tokens,
            corpus="job", finish_reason=None, text_end=None,
        )  # fmt: skip

    drafter = module.SuffixDrafter(target, module.Corpora())
    for it, r in zip(items[: args.history], answers, strict=False):
        s = seq(it)
        drafter.admit(s)
        s.output, s.finish_reason = list(r), "stop"
        drafter.retire(s)
    rows = [
        (seq(it), r) for it, r in zip(items[args.history :], answers[args.history :], strict=True)
    ]
    for s, _ in rows:
        drafter.admit(s)
    seconds, proposals, matched, proposed = 0.0, 0, 0, 0
    at = {s.uid: 1 for s, _ in rows}  # tokens each row has (the first came with its prompt)
    while live := [(s, toks) for s, toks in rows if at[s.uid] <= len(toks)]:
        for s, toks in live:
            s.output = toks[: at[s.uid]]
        seqs = [s for s, _ in live]
        t0 = time.thread_time()
        if prof is not None:
            prof.enable()
        draft = drafter.propose(seqs, [args.k] * len(seqs))
        if prof is not None:
            prof.disable()
        seconds += time.thread_time() - t0
        proposals += len(seqs)
        kept = []
        for (s, toks), d in zip(live, draft.tokens, strict=True):
            future = toks[at[s.uid] : at[s.uid] + len(d)]
            n = next(
                (i for i, (a, b) in enumerate(zip(d, future, strict=False)) if a != b),
                min(len(d), len(future)),
            )
            matched += n
            proposed += len(d)
            at[s.uid] += n + 1 if args.advance == "accepted" else 1
            kept.append(list(range(n)))
        drafter.commit(seqs, draft, kept)
    return seconds, proposals, matched, proposed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--history", type=int, default=128)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3, help="replays of each version")
    ap.add_argument("--advance", choices=("accepted", "one"), default="accepted")
    ap.add_argument("--profile", action="store_true", help="cProfile the last replay")
    ap.add_argument("--answers", help="a JSON file keeping the plain answers between runs")
    ap.add_argument("--against", help="another suffix.py, timed alternately in this process")
    args = ap.parse_args()
    target = load_model(args.model)
    items = load_job(target, args.input, None)[: args.history + args.rows]
    kept = Path(args.answers) if args.answers else None
    if kept is not None and kept.exists():
        answers = json.loads(kept.read_text())[: len(items)]
    else:
        engine = Engine(target, draft="none", batch_size=64)
        reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
        answers = [r.tokens for r in engine.generate_many(reqs)]
        if kept is not None:
            kept.write_text(json.dumps(answers))
    versions = {"this": suffix}
    if args.against:
        versions["other"] = load_other(args.against)
    us: dict[str, list[float]] = {name: [] for name in versions}
    counts = {}
    for _ in range(args.repeat):
        for name, module in versions.items():
            seconds, proposals, matched, proposed = replay(module, target, items, answers, args)
            us[name].append(1e6 * seconds / proposals)
            counts[name] = (proposals, matched, proposed)
    for name in versions:
        proposals, matched, proposed = counts[name]
        print(
            f"{name}: {min(us[name]):.0f} us per row proposal (fastest of {args.repeat}), "
            f"{proposals} proposals, {matched} of {proposed} proposed tokens match the answer"
        )
    if args.against:
        ratios = [o / t for t, o in zip(us["this"], us["other"], strict=True)]
        print(
            f"other / this, replay by replay: {' '.join(f'{r:.2f}' for r in ratios)}; "
            f"median {statistics.median(ratios):.2f}"
        )
    if args.profile:
        prof = cProfile.Profile()
        replay(suffix, target, items, answers, args, prof)
        pstats.Stats(prof).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
