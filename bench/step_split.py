"""Where a batched step's wall time goes on a device, by configuration, in one process:
each `mx.async_eval` by its caller (the step's one launch, the kept states' gather), the
self-drafter's graph building (`propose`), and the nodes drafted per drafting step. Each
configuration runs the job twice: the first pass (this process's first meeting of each
shape: kernels and attention graphs built) is timed apart from the second.

    PYTHONPATH=. python bench/step_split.py open-held-out.jsonl '["none", {}]' \\
        '["head", {"step_modes": false}]' '["head", {"k": 1}]' '["head", {}]'

Each configuration is `[draft spec, Engine keyword arguments]`; batch size 64 unless the
keywords say. `N` and `M` (environment) cap the items and their max_tokens.
"""

import collections
import json
import os
import sys
import time
import traceback

import mlx.core as mx

from core.engine import Engine, GenerationParams, generate, load_model
from core.engine.benchmark import load_job
from core.engine.drafters.feature_head import FeatureHeadDrafter


def main() -> None:
    target = load_model("smollm2-135m")
    items = load_job(target, sys.argv[1], None)[: int(os.environ.get("N", 49))]
    cap = int(os.environ.get("M", 10**6))
    reqs = [(it.prompt, GenerationParams(max_tokens=min(it.max_tokens, cap))) for it in items]
    configs = [json.loads(c) for c in sys.argv[2:]] or [["none", {}], ["head", {}]]
    async_eval, propose, draft = mx.async_eval, FeatureHeadDrafter.propose, generate.Batch._draft
    for spec, kw in configs:
        eng = Engine(target, draft=spec, **{"batch_size": 64, **kw})
        t0 = time.perf_counter()
        out = eng.generate_many(reqs)
        first = time.perf_counter() - t0
        print(
            f"== {spec} {kw} first pass: {sum(len(r.tokens) for r in out)} tokens in {first * 1000:.0f} ms"
        )
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
            out = eng.generate_many(reqs)
            wall = time.perf_counter() - t0
        finally:
            mx.async_eval, FeatureHeadDrafter.propose = async_eval, propose
            generate.Batch._draft = draft
        toks = sum(len(r.tokens) for r in out)
        print(f"== {spec} {kw}: {toks} tokens in {wall * 1000:.0f} ms ({toks / wall:.0f} tok/s)")
        for key, s in sec.most_common():
            ms = 1000 * s
            print(f"   {key:40s} {calls[key]:5d} calls {ms / calls[key]:7.2f} ms/call {ms:7.0f} ms")
        steps = sum(plans.values())
        if steps:
            nodes = sum(n * c for (_, n), c in plans.items())
            print(f"   drafting steps {steps}, drafted nodes {nodes} ({nodes / steps:.1f} a step)")


if __name__ == "__main__":
    main()
