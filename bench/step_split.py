"""Where a batched step's wall time goes, by configuration, in one process: the parts of
each step the engine reports (observer.StepReport.phases: planning, drafting, the forward's
graph, the host's overlap, the sync, the commit; the plain and loop runners' whole steps),
the steps by kind and the nodes drafted per drafting step. Each configuration runs the job
twice: the first pass (this process's first meeting of each shape: kernels and attention
graphs built) is timed apart from the second.

    PYTHONPATH=. python bench/step_split.py open-held-out.jsonl '["none", {}]' \\
        '["head", {"step_modes": false}]' '["head", {"k": 1}]' '["head", {}]'

Each configuration is `[draft spec, Engine keyword arguments]`; batch size 64 unless the
keywords say. `N` and `M` (environment) cap the items and their max_tokens; `MODEL` names
the model (default smollm2-135m; `random:llama-3-8b-4bit` for an architecture's shape).
`"oracle": true` replaces the configuration's drafters with one that drafts the first
configuration's output (`bench/oracle.py`): with none first, the ceiling of drafting at
this batch size.

With `R` (environment) rounds, every configuration then runs once per round, in turn (each
round starting one configuration further on) and untimed inside: a GPU host's step time
drifts within one process, so only configurations run side by side in each round compare.
Printed: each round's tokens/s and its ratio to the first configuration, the median ratio,
and each configuration's tokens per drafting step.
"""

import collections
import json
import os
import sys
import time

import oracle

from core.benchmark import load_job
from core.engine import Engine, GenerationParams
from core.models import load_model


class Steps:
    """A step observer: seconds and calls by part, steps by kind, drafting steps' nodes."""

    def __init__(self):
        self.sec, self.calls = collections.Counter(), collections.Counter()
        self.kinds, self.chains = collections.Counter(), collections.Counter()
        self.drafting = collections.Counter()  # drafting steps, nodes drafted

    def __call__(self, r) -> None:
        for part, sec in r.phases.items():
            self.sec[part] += sec
            self.calls[part] += 1
        if r.decoding:
            self.kinds[r.kind] += 1
        if r.runner == "synced" and r.drafters:
            self.drafting["steps"] += 1
            self.drafting["nodes"] += r.drafted


def main() -> None:
    target = load_model(os.environ.get("MODEL", "smollm2-135m"))
    items = load_job(target, sys.argv[1], None)[: int(os.environ.get("N", 49))]
    cap = int(os.environ.get("M", 10**6))
    reqs = [(it.prompt, GenerationParams(max_tokens=min(it.max_tokens, cap))) for it in items]
    configs = [json.loads(c) for c in sys.argv[2:]] or [["none", {}], ["head", {}]]
    engines = []
    first_out = None
    for spec, kw in configs:
        eng = Engine(target, draft=spec, **{"batch_size": 64, **_engine_kw(kw)})
        if kw.get("oracle"):
            if first_out is None:
                sys.exit("an oracle configuration drafts the first one's output: put one before it")
            oracle.install(eng, reqs, first_out)
        engines.append(eng)
        t0 = time.perf_counter()
        out = _run(eng, reqs)
        first = time.perf_counter() - t0
        print(
            f"== {spec} {kw} first pass: {sum(len(r.tokens) for r in out)} tokens in {first * 1000:.0f} ms"
        )
        if first_out is None:
            first_out = out
        else:
            print(f"   {_same(target, reqs, first_out, out)}")
        steps = Steps()
        eng.observers.append(steps)
        t0 = time.perf_counter()
        out = _run(eng, reqs)
        wall = time.perf_counter() - t0
        eng.observers.remove(steps)
        toks = sum(len(r.tokens) for r in out)
        print(
            f"== {spec} {kw}: {toks} tokens in {wall * 1000:.0f} ms ({toks / wall:.0f} tok/s)"
            f"{_chains(eng, steps)}"
        )
        for key, s in steps.sec.most_common():
            ms = 1000 * s
            n = steps.calls[key]
            print(f"   {key:40s} {n:5d} calls {ms / n:7.2f} ms/call {ms:7.0f} ms")
        n = steps.drafting["steps"]
        if n:
            nodes = steps.drafting["nodes"]
            print(f"   drafting steps {n}, drafted nodes {nodes} ({nodes / n:.1f} a step)")
    rounds(configs, engines, reqs, int(os.environ.get("R", 0)))


def _same(target, reqs, want, got) -> str:
    """How many rows' output equals the first configuration's; where one differs, the
    reference's top-two logit gap at the first difference (batched matmuls round by batch
    shape: a near-tie may go either way, `benchmark.GAP_BUG`)."""
    from core.benchmark import GAP_BUG, first_difference, top_gap

    same, gaps = 0, []
    for (prompt, _), w, g in zip(reqs, want, got, strict=True):
        if g.tokens == w.tokens:
            same += 1
        else:
            j = first_difference(g.tokens, w.tokens)
            gaps.append(top_gap(target, prompt, w.tokens[:j]))
    listed = f"; gaps at the first difference {', '.join(f'{x:.3g}' for x in sorted(gaps))}"
    near = sum(x < GAP_BUG for x in gaps)
    return f"output: {same}/{len(want)} rows as the first configuration's" + (
        f"{listed} ({near} of {len(gaps)} below {GAP_BUG})" if gaps else ""
    )


def _engine_kw(kw: dict) -> dict:
    return {k: v for k, v in kw.items() if k != "oracle"}


def _run(eng, reqs):
    """The job through one batch of `eng`; its results in request order. The batch is kept
    in `LAST[id(eng)]` (its step modes' trials, the loop's chains and pricing)."""
    batch = eng.new_batch()
    for i, (p, q) in enumerate(reqs):
        batch.submit(p, q, tag=i, corpus="job")
    out = sorted(batch.run(), key=lambda r: r.tag)
    eng.corpora.drop("job")
    LAST[id(eng)] = batch
    return out


LAST: dict[int, object] = {}  # per engine: its last run's batch


def _chains(eng, steps: Steps | None = None) -> str:
    b = LAST.get(id(eng))
    out = ""
    if steps is not None and steps.kinds:
        out += "; steps by kind " + ", ".join(f"{k}: {n}" for k, n in steps.kinds.items())
    if b is not None and b.loop is not None:
        if b.loop.chains:
            out += "; loop steps by chain length " + ", ".join(
                f"{k}: {n}" for k, n in sorted(b.loop.chains.items())
            )
        out += "; loop's predicted speedup by chain length " + " ".join(
            f"{x:.2f}" for x in b.loop.speedups()
        )
    for kinds, won in b.modes.trials if b is not None and b.modes else []:
        out += f"\n     trial -> {won}: " + ", ".join(  # kind steps/tokens/ms, its rate
            f"{k} {n}/{tok}/{1000 * sec:.0f}ms {tok / sec if sec else 0:.0f} tok/s"
            for k, (n, tok, sec) in kinds.items()
        )
    return out


def rounds(configs, engines, reqs, n: int) -> None:
    """`n` rounds of every configuration in turn (module docstring)."""
    if n <= 0:
        return
    rates = [[] for _ in configs]
    for r in range(n):
        # Each round starts one configuration further on: the first of a round meets its
        # new shapes first (docs/decisions.md).
        order = [(r + i) % len(engines) for i in range(len(engines))]
        for j in order:
            eng = engines[j]
            t0 = time.perf_counter()
            out = _run(eng, reqs)
            wall = time.perf_counter() - t0
            rates[j].append(sum(len(o.tokens) for o in out) / wall)
            if r == n - 1:  # the last round's acceptance
                spec = [o.speculative for o in out]
                drafted = sum(s["draft_tokens"] for s in spec)
                steps = sum(s["verify_steps"] for s in spec)
                by = collections.defaultdict(lambda: [0, 0, 0])  # row steps, drafted, accepted
                for s in spec:
                    for d, c in s["steps_by_drafter"].items():
                        by[d][0] += c
                    for d, c in s["draft_tokens_by_drafter"].items():
                        by[d][1] += c
                    for d, c in s["accepted_by_drafter"].items():
                        by[d][2] += c
                per = ", ".join(f"{d} {c}/{k}/{a}" for d, (c, k, a) in sorted(by.items()))
                configs[j].append(
                    f"; last round: {sum(len(o.tokens) for o in out) / steps:.2f} tokens a "
                    f"row's step, {sum(s['accepted_tokens'] for s in spec) / max(drafted, 1):.2f} "
                    f"of {drafted} drafted tokens accepted (by drafter, row steps/drafted/"
                    f"accepted: {per}){_chains(eng)}"
                )
        line = [f"{x[-1]:7.0f} ({x[-1] / rates[0][-1]:.2f}x)" for x in rates]
        print(f"round {r + 1}: " + "  ".join(line))
    for j, (spec, kw, *per) in enumerate(configs):
        ratios = sorted(a / b for a, b in zip(rates[j], rates[0], strict=True))
        med = ratios[len(ratios) // 2] if n % 2 else sum(ratios[n // 2 - 1 : n // 2 + 1]) / 2
        rate = sorted(rates[j])[len(rates[j]) // 2]
        print(
            f"== {spec} {kw}: median {rate:.0f} tok/s, median ratio {med:.2f}x "
            f"(rounds {', '.join(f'{x:.2f}' for x in ratios)}){''.join(per)}"
        )


if __name__ == "__main__":
    main()
