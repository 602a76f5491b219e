"""One job's energy as the service reports it, read from this machine's meter (NVML on an
NVIDIA GPU, RAPL on Linux): the job through the engine, each finished request taking the
energy used since the previous one (`core.energy.EnergyClock`, as a worker does).

    PYTHONPATH=. python bench/energy_job.py [--model smollm2-135m] [--input JOB]

Prints the meter, the job's joules, joules per 1k tokens and the requests' spread; "not
measured" where the machine has no meter.
"""

from __future__ import annotations

import argparse
import json
import time

from core.energy import EnergyClock, find_meter


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--input", default="examples/jobs/grounded-64.jsonl")
    a = ap.parse_args()
    from core.benchmark import load_job
    from core.engine import Engine, GenerationParams
    from core.models import load_model

    target = load_model(a.model)
    items = load_job(target, a.input, None)
    engine = Engine(target, draft="auto", max_rows=len(items))
    engine.prepare()
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    engine.generate_many(reqs[:2])  # first shapes
    clock = EnergyClock(find_meter())
    per: list[float] = []
    clock.mark()
    t0 = time.perf_counter()
    out = engine.generate_many(reqs, on_result=lambda r: per.append(clock.split()))
    wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in out)
    if clock.source is None or any(j is None for j in per):
        print(json.dumps({"meter": None, "energy": "not measured", "tokens": tokens}))
        return
    joules = sum(per)
    print(
        json.dumps(
            {
                "meter": clock.source,
                "requests": len(per),
                "tokens": tokens,
                "wall_s": round(wall, 3),
                "joules": round(joules, 2),
                "joules_per_1k_tokens": round(1000 * joules / tokens, 2),
                "watts": round(joules / wall, 1),
                "request_joules_min_max": [round(min(per), 3), round(max(per), 3)],
            }
        )
    )


if __name__ == "__main__":
    main()
