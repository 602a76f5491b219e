"""Where a batched step's wall time goes on a device, by configuration, in one process:
each `mx.async_eval` by its caller (the step's one launch, the kept states' gather), the
self-drafter's graph building (`propose`), and the nodes drafted per drafting step. Each
configuration runs the job twice: the first pass (this process's first meeting of each
shape: kernels and attention graphs built) is timed apart from the second.

    PYTHONPATH=. python bench/step_split.py open-held-out.jsonl '["none", {}]' \\
        '["head", {"step_modes": false}]' '["head", {"k": 1}]' '["head", {}]'

Each configuration is `[draft spec, Engine keyword arguments]`; batch size 64 unless the
keywords say. `N` and `M` (environment) cap the items and their max_tokens; `MODEL` names
the model (default smollm2-135m; `random:llama-3-8b-4bit` for an architecture's shape).
The keyword `"head_cost": "share"` prices the head's drafting depths by the share of the
weights they read instead of timing one (`FeatureHeadDrafter.step_cost`), to compare the
two. `"oracle": true` replaces the configuration's drafters with one that drafts the first
configuration's output (`bench/oracle.py`): with none first, the ceiling of drafting at
this batch size.

With `R` (environment) rounds, every configuration then runs once per round, in turn (each
round starting one configuration further on) and untimed inside: a GPU host's step time
drifts by up to 2x within one process (plain steps at 6 ms and at 11 ms a launch), so only
configurations run side by side in each round compare. Printed: each round's tokens/s and
its ratio to the first configuration, the median ratio, and each configuration's tokens per
drafting step.
"""

import collections
import json
import os
import sys
import time
import traceback

import mlx.core as mx
import oracle

from core.benchmark import load_job
from core.engine import Engine, GenerationParams, generate
from core.engine.drafters.feature_head import FeatureHeadDrafter
from core.models import load_model


def main() -> None:
    target = load_model(os.environ.get("MODEL", "smollm2-135m"))
    items = load_job(target, sys.argv[1], None)[: int(os.environ.get("N", 49))]
    cap = int(os.environ.get("M", 10**6))
    reqs = [(it.prompt, GenerationParams(max_tokens=min(it.max_tokens, cap))) for it in items]
    configs = [json.loads(c) for c in sys.argv[2:]] or [["none", {}], ["head", {}]]
    engines = []
    measure = FeatureHeadDrafter._measured_depth

    def shown(self, rows):  # each timing of a drafting depth, as it is made
        new = rows not in self._depth_ms
        ms = measure(self, rows)
        if new:
            print(f"   (the head's drafting depth timed at {rows} rows: {ms:.2f} ms)")
        return ms

    FeatureHeadDrafter._measured_depth = shown
    async_eval, propose, draft = mx.async_eval, FeatureHeadDrafter.propose, generate.Batch._draft
    first_out = None
    for spec, kw in configs:
        eng = Engine(target, draft=spec, **{"batch_size": 64, **_engine_kw(kw)})
        if kw.get("oracle"):
            if first_out is None:
                sys.exit("an oracle configuration drafts the first one's output: put one before it")
            oracle.install(eng, reqs, first_out)
        engines.append(eng)
        t0 = time.perf_counter()
        out = _run(eng, kw, reqs)
        first = time.perf_counter() - t0
        print(
            f"== {spec} {kw} first pass: {sum(len(r.tokens) for r in out)} tokens in {first * 1000:.0f} ms"
        )
        if first_out is None:
            first_out = out
        else:
            print(f"   {_same(target, reqs, first_out, out)}")
        sec, calls, plans = collections.Counter(), collections.Counter(), collections.Counter()

        def timed_async(*a, _s=sec, _c=calls):
            f = traceback.extract_stack(limit=2)[0]
            key = f"async_eval {os.path.basename(f.filename)}:{f.lineno}"
            t = time.perf_counter()
            r = async_eval(*a)
            _s[key] += time.perf_counter() - t
            _c[key] += 1
            return r

        def timed_propose(self, seqs, ks, _s=sec, _c=calls):
            t = time.perf_counter()
            r = propose(self, seqs, ks)
            _s["head propose (graph)"] += time.perf_counter() - t
            _c["head propose (graph)"] += 1
            return r

        def counted_draft(self, decode, _p=plans):
            plan = draft(self, decode)
            _p[(len(decode), sum(sum(d.sizes) for d in plan.drafts.values()))] += 1
            return plan

        mx.async_eval, FeatureHeadDrafter.propose = timed_async, timed_propose
        generate.Batch._draft = counted_draft
        try:
            t0 = time.perf_counter()
            out = _run(eng, kw, reqs)
            wall = time.perf_counter() - t0
        finally:
            mx.async_eval, FeatureHeadDrafter.propose = async_eval, propose
            generate.Batch._draft = draft
        toks = sum(len(r.tokens) for r in out)
        print(
            f"== {spec} {kw}: {toks} tokens in {wall * 1000:.0f} ms ({toks / wall:.0f} tok/s)"
            f"{_chains(eng)}"
        )
        for key, s in sec.most_common():
            ms = 1000 * s
            print(f"   {key:40s} {calls[key]:5d} calls {ms / calls[key]:7.2f} ms/call {ms:7.0f} ms")
        steps = sum(plans.values())
        if steps:
            nodes = sum(n * c for (_, n), c in plans.items())
            print(f"   drafting steps {steps}, drafted nodes {nodes} ({nodes / steps:.1f} a step)")
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
    kept = ("head_cost", "oracle")
    return {k: v for k, v in kw.items() if k not in kept}


def _run(eng, kw: dict, reqs):
    """The job through `eng`; with `"head_cost": "share"` the head's depths priced by the
    share of the weights they read. Its batch's resident loop steps by chain length are
    left in `CHAINS[id(eng)]`."""
    made = []
    new = eng.new_batch
    eng.new_batch = lambda capacity=None: made.append(new(capacity)) or made[-1]
    measured = FeatureHeadDrafter.step_cost
    if kw.get("head_cost") == "share":
        FeatureHeadDrafter.step_cost = lambda self, rows: self._share
    try:
        return eng.generate_many(reqs)
    finally:
        FeatureHeadDrafter.step_cost = measured
        del eng.new_batch
        CHAINS[id(eng)] = sum((b.loop_steps for b in made), collections.Counter())
        KINDS[id(eng)] = sum(
            (collections.Counter(b.modes.steps) for b in made if b.modes), collections.Counter()
        )
        TRIALS[id(eng)] = [t for b in made if b.modes for t in b.modes.trials]
        last = next((b for b in reversed(made) if b._loop_head is not None), None)
        LOOP[id(eng)] = None if last is None else last.loop_speedups()  # as this run priced


CHAINS: dict[int, collections.Counter] = {}
KINDS: dict[int, collections.Counter] = {}  # the step modes' steps by kind
TRIALS: dict[int, list] = {}  # the step modes' trials (StepModes.trials)
LOOP: dict[int, object] = {}  # the loop's predicted speedups by chain length, at the end


def _chains(eng) -> str:
    c, kinds = CHAINS.get(id(eng)), KINDS.get(id(eng))
    out = ""
    if kinds:
        out += "; steps by kind " + ", ".join(f"{k}: {n}" for k, n in kinds.items())
    if c:
        out += "; loop steps by chain length " + ", ".join(
            f"{k}: {n}" for k, n in sorted(c.items())
        )
    if LOOP.get(id(eng)) is not None:  # why the loop chose its chain (Batch._loop_k)
        out += "; loop's predicted speedup by chain length " + " ".join(
            f"{x:.2f}" for x in LOOP[id(eng)]
        )
    for kinds, won in TRIALS.get(id(eng), []):  # each trial: kind steps/tokens/ms, its rate
        out += f"\n     trial -> {won}: " + ", ".join(
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
        # Each round starts one configuration further on: on an H100 `auto` run right after
        # none was 1.47x none in all of three rounds where the same code run third was
        # 1.74-2.01x (the first of a round likely meets its new shapes first: kernels and
        # attention graphs built, tens of ms each on a GPU).
        order = [(r + i) % len(engines) for i in range(len(engines))]
        for j in order:
            eng = engines[j]
            t0 = time.perf_counter()
            out = _run(eng, configs[j][1], reqs)
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
