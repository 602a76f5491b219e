"""A job through the service against the same job in the bench, one after the other on this
machine: `applespec submit` -> Redis -> one `applespec worker` (one pool process, one
continuous batch) -> SQL, timed from submit to the last result, against `applespec bench`'s
`ours_batched_spec` row at the same batch size (both warm: the worker has run a small job
first, the bench warms up itself).

    python bench/service_throughput.py --input examples/jobs/grounded-256.jsonl --batch-size 64

Needs Redis at 127.0.0.1:6379 (it uses database 7) and writes a SQLite store in a temporary
directory. Prints one JSON object: tokens/s of both and their ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from local_service import APPLESPEC, ROOT, run_job, service_env, workers


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", default="examples/jobs/grounded-256.jsonl")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--draft", default="auto")
    ap.add_argument("--broker", default="redis://127.0.0.1:6379/7")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="applespec-service-"))
    env = service_env(f"sqlite:///{tmp / 'store.db'}", args.broker, args.batch_size)
    with workers(env, [tmp / "worker.log"]):
        from api.client import Client
        from core.settings import Settings

        client = Client(Settings.from_env(env))
        lines = Path(args.input).read_text().splitlines()
        warm = tmp / "warm.jsonl"
        warm.write_text("\n".join(lines[:4]) + "\n")
        run_job(client, str(warm), args.draft, timeout=900)
        t0 = time.perf_counter()
        job = run_job(client, args.input, args.draft)
        service_s = time.perf_counter() - t0
        tokens = sum(
            r["response"]["body"]["usage"]["completion_tokens"]
            for r in client.results(job["id"])
            if r.get("response")
        )
    out = tmp / "bench.json"
    subprocess.run(
        [
            APPLESPEC,
            "bench",
            "--input",
            args.input,
            "--draft",
            args.draft,
            "--rows",
            "ours_batched_spec",
            "--our-batch-sizes",
            str(args.batch_size),
            "--reference",
            "ours_single",
            "--reference-items",
            "1",
            "-o",
            str(out),
        ],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    rows = {r["name"]: r for r in json.loads(out.read_text())["rows"]}
    bench = rows["ours_batched_spec"]["tokens_per_s"]
    service = tokens / service_s
    print(
        json.dumps(
            {
                "input": args.input,
                "batch_size": args.batch_size,
                "draft": args.draft,
                "service_tokens": tokens,
                "service_seconds": round(service_s, 2),
                "service_tokens_per_s": round(service, 2),
                "bench_ours_batched_spec_tokens_per_s": bench,
                "service_vs_bench": round(service / bench, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
