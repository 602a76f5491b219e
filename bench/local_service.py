"""A local service for the bench scripts: a store, Redis, `applespec worker` processes, and a
job submitted to them and waited for (bench/service_throughput.py, bench/two_workers.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APPLESPEC = str(Path(sys.executable).with_name("applespec"))


def service_env(store_url: str, broker: str, batch_size: int, **extra: str) -> dict[str, str]:
    """This process's environment with the service's settings."""
    return {
        **os.environ,
        "APPLESPEC_DATABASE_URL": store_url,
        "APPLESPEC_BROKER_URL": broker,
        "APPLESPEC_BATCH_SIZE": str(batch_size),
        **extra,
    }


@contextmanager
def workers(env: dict[str, str], logs: list[Path], hostnames: bool = False) -> Iterator[None]:
    """The store migrated, then one worker per log file (`w{i}@%h` when `hostnames`),
    stopped on the way out."""
    subprocess.run([APPLESPEC, "db", "upgrade"], env=env, check=True, capture_output=True)
    files = [open(log, "w") for log in logs]
    procs = [
        subprocess.Popen(
            [APPLESPEC, "worker", *(["--hostname", f"w{i}@%h"] if hostnames else [])],
            env=env,
            stdout=f,
            stderr=f,
            cwd=ROOT,
        )
        for i, f in enumerate(files)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(60)
        for f in files:
            f.close()


def run_job(client, path: str, draft: str, timeout: float = 3600) -> dict:
    """Submit a job file and wait for it; a file with invalid lines stops the script."""
    job = client.submit(str(Path(path).resolve()), draft=draft)
    if job["invalid"]:
        raise SystemExit(f"{path}: {job['invalid'][0]['message']}")
    client.wait(job["id"], timeout=timeout)
    return job
