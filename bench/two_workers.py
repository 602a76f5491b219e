"""Two workers on one job, sharing the job's suffix index through the store against each
keeping its own (`APPLESPEC_SHARE_ANSWERS=0`), one after the other on this machine:
`applespec submit` -> Redis -> two `applespec worker` processes (one continuous batch each)
-> SQL.

    python examples/make_jobs.py --kind labeling --items 128 -o labeling-128.jsonl
    python bench/two_workers.py --input labeling-128.jsonl --batch-size 16

Per configuration it prints the job's mean accepted length (tokens per verify step over all
items), tokens/s from submit to the last result, and the mean accepted length by the item's
position in the job's finish order (eighths). Needs Redis at 127.0.0.1:6379 (database 8) and
writes SQLite stores in a temporary directory. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from local_service import run_job, service_env, workers


def run(args, share: bool, tmp: Path) -> dict:
    import redis
    from sqlalchemy import select

    from api.client import Client, open_sessions
    from core.settings import Settings
    from core.store.models import Item, Metric

    redis.Redis.from_url(args.broker).flushdb()
    url = f"sqlite:///{tmp / ('shared' if share else 'own')}.db"
    env = service_env(
        url, args.broker, args.batch_size, APPLESPEC_SHARE_ANSWERS="1" if share else "0"
    )
    logs = [tmp / f"worker-{share}-{i}.log" for i in range(2)]
    with workers(env, logs, hostnames=True):
        client = Client(Settings.from_env(env))
        t0 = time.perf_counter()
        job = run_job(client, args.input, args.draft)
        wall = time.perf_counter() - t0
        with open_sessions(url)() as s:
            rows = s.execute(
                select(Metric.completion_tokens, Metric.verify_steps, Metric.worker_host)
                .join(Item, Item.id == Metric.item_id)
                .where(Item.job_id == job["id"])
                .order_by(Metric.created_at, Metric.id)
            ).all()
    tokens = sum(r[0] for r in rows)
    steps = sum(r[1] or 0 for r in rows)
    n = len(rows)
    curve = []
    for e in range(8):
        part = rows[e * n // 8 : (e + 1) * n // 8]
        st = sum(r[1] or 0 for r in part)
        curve.append(round(sum(r[0] for r in part) / st, 3) if st else None)
    return {
        "share_answers": share,
        "items": n,
        "workers": sorted({r[2] for r in rows}),
        "tokens": tokens,
        "seconds": round(wall, 1),
        "tokens_per_s": round(tokens / wall, 2),
        "mean_accepted_length": round(tokens / steps, 3) if steps else None,
        "accepted_length_by_eighth": curve,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default="examples/jobs/labeling-64.jsonl")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--draft", default="suffix")
    ap.add_argument("--broker", default="redis://127.0.0.1:6379/8")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="applespec-two-workers-"))
    out = {"input": args.input, "batch_size": args.batch_size, "draft": args.draft, "runs": []}
    for share in (True, False):
        out["runs"].append(run(args, share, tmp))
        print(json.dumps(out["runs"][-1]), file=sys.stderr, flush=True)
    a, b = (r["mean_accepted_length"] for r in out["runs"])
    out["shared_vs_own_accepted_length"] = round(a / b, 3) if a and b else None
    out["shared_vs_own_tokens_per_s"] = round(
        out["runs"][0]["tokens_per_s"] / out["runs"][1]["tokens_per_s"], 3
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
