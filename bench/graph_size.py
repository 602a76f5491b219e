"""Graph primitives per `mx.async_eval` call site of a batched job, by configuration (each
launch's graph written with MLX's `export_to_dot` and its nodes counted): how much larger a
drafting step's graph is than a plain one's. On a GPU running a small model a step costs
about what launching its kernels does, so this is the device-independent half of a drafting
step's price. `APPLESPEC_KV_PAD=64` gives the CUDA backend's layout on any machine (every
slot in one segment, reads padded); on the CPU the float32 path adds `cpu_math`'s nodes.

    APPLESPEC_KV_PAD=64 PYTHONPATH=. python bench/graph_size.py open-held-out.jsonl \\
        '["none", {}]' '["head", {"k": 1}]'

Each configuration is `[draft spec, Engine keyword arguments]` at batch 64; `N` and `M`
(environment) cap the items (16) and their max_tokens (12). `head` needs a stored head
(`applespec calibrate --exit-layer head`): the counts do not depend on its weights.
"""

import collections
import json
import os
import re
import sys
import tempfile
import traceback

import mlx.core as mx

from core.benchmark import load_job
from core.engine import Engine, GenerationParams
from core.models import load_model


def main() -> None:
    target = load_model("smollm2-135m")
    items = load_job(target, sys.argv[1], None)[: int(os.environ.get("N", 16))]
    cap = int(os.environ.get("M", 12))
    reqs = [(it.prompt, GenerationParams(max_tokens=cap)) for it in items]
    for spec, kw in [json.loads(c) for c in sys.argv[2:]]:
        eng = Engine(target, draft=spec, batch_size=64, **kw)
        eng.generate_many(reqs)  # shapes met once
        counts, calls = count_launches(lambda e=eng: e.generate_many(reqs))
        print(f"== {spec} {kw}")
        for key, n in calls.most_common():
            c = counts[key]
            print(f"   {key}: {n} calls, {sum(c.values()) / n:.0f} primitives a call")
            print("      " + ", ".join(f"{k} {v / n:.1f}" for k, v in c.most_common(12)))


def count_launches(run):
    """Run `run()` with every `mx.async_eval` graph counted by primitive, per call site."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    calls: collections.Counter = collections.Counter()
    real = mx.async_eval

    def counted(*a):
        f = traceback.extract_stack(limit=2)[0]
        key = f"{os.path.basename(f.filename)}:{f.lineno}"
        flat = a[0] if len(a) == 1 and isinstance(a[0], list | tuple) else a
        arrays = [x for x in flat if isinstance(x, mx.array)]
        if arrays:
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "graph.dot")
                mx.export_to_dot(path, *arrays)
                with open(path, encoding="utf-8") as fh:
                    counts[key].update(re.findall(r'label ="([^"]+)"', fh.read()))
            calls[key] += 1
        return real(*a)

    mx.async_eval = counted
    try:
        run()
    finally:
        mx.async_eval = real
    return counts, calls


if __name__ == "__main__":
    main()
