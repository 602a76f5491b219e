"""The batch service's own overhead per item (queue + SQL) against engine time.

Runs one real `applespec worker` on a fresh SQLite store, warms it up with a one-item job
(model load and the verify-cost measurement are not service overhead), then submits N items
and compares, from the store's own timestamps,

    service time = job completed_at - first item queued_at     (queue, SQL, engine)
    engine time  = sum of the engine's total_s over the items  (prefill + decode)
    overhead     = (service time - engine time) / engine time

With one worker process the items run one after another, so the difference is what the
service adds (Redis delivery, claiming and committing each item, recounting the job).

    .venv/bin/python bench/service_overhead.py --model tiny-random --items 48
    .venv/bin/python bench/service_overhead.py --model smollm2-135m --items 8 --max-tokens 24
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from api.client import Client  # noqa: E402
from core.settings import Settings  # noqa: E402
from core.store import repo  # noqa: E402
from core.store.models import Item, Metric  # noqa: E402
from tests.worker.service import Worker, service_env  # noqa: E402

PROMPTS = [
    "Write one sentence about the sea.",
    "List three fruits.",
    "What is 12 times 7?",
    "Describe a cat in five words.",
    "Translate 'good morning' to French.",
    "Give a synonym for 'fast'.",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--draft", default="auto")
    parser.add_argument("--items", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/12")
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="applespec-bench-"))
    env = service_env(f"sqlite:///{tmp / 'bench.db'}", broker_url=args.broker)
    import os

    os.environ.update(env)
    client = Client(Settings.from_env())
    client.sessions  # noqa: B018 - migrate before the worker starts
    worker = Worker(env, args.model, tmp / "worker.log")
    try:
        worker.wait_ready(timeout=120)
        warm = client.submit(
            [{"custom_id": "warm", "prompt": "hi"}],
            model=args.model,
            draft=args.draft,
            max_tokens=4,
        )
        client.wait(warm["id"], timeout=900)
        requests = [
            {
                "custom_id": f"r{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]},
            }
            for i in range(args.items)
        ]
        t0 = time.perf_counter()
        job = client.submit(
            requests,
            model=args.model,
            draft=args.draft,
            max_tokens=args.max_tokens,
            chunk_size=args.chunk_size,
        )
        submit_s = time.perf_counter() - t0
        final = client.wait(job["id"], timeout=3600, interval=0.2)
    finally:
        worker.stop()

    with client.sessions() as s:
        job_row = repo.get_job(s, job["id"])
        first_queued = s.scalar(select(func.min(Item.queued_at)).where(Item.job_id == job["id"]))
        engine_s, tokens, n = s.execute(
            select(func.sum(Metric.total_s), func.sum(Metric.completion_tokens), func.count())
            .join(Item, Item.id == Metric.item_id)
            .where(Item.job_id == job["id"])
        ).one()
    service_s = (repo.aware(job_row.completed_at) - repo.aware(first_queued)).total_seconds()
    report = {
        "model": args.model,
        "draft": args.draft,
        "status": final["status"],
        "items": n,
        "completion_tokens": tokens,
        "submit_s": round(submit_s, 3),
        "service_s": round(service_s, 3),
        "engine_s": round(engine_s, 3),
        "overhead_s": round(service_s - engine_s, 3),
        "overhead_per_item_ms": round(1000 * (service_s - engine_s) / n, 2),
        "overhead_ratio": round((service_s - engine_s) / engine_s, 4),
    }
    print(json.dumps(report, indent=2))
    print(
        f"service overhead: {100 * report['overhead_ratio']:.2f}% of engine time "
        f"({report['overhead_per_item_ms']} ms/item; {n} items, {args.model})"
    )


if __name__ == "__main__":
    main()
