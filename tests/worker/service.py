"""Helpers for tests that run real Redis and real `applespec worker` subprocesses."""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import select

from api.cli import cli
from core.store.database import make_engine, make_sessionmaker
from core.store.models import Item, Job, Metric, Result
from tests.support import hooked_cli

ROOT = Path(__file__).resolve().parents[2]
SHARED_REDIS = "redis://127.0.0.1:6379/11"


def unique_model() -> str:
    """`tiny-random:SEED` with a random seed: its own queue on a shared Redis."""
    return f"tiny-random:{random.randrange(10_000, 99_999)}"


def service_env(
    db_url: str, broker_url: str = SHARED_REDIS, migrated: bool = True, **extra: str
) -> dict[str, str]:
    """A farm's APPLESPEC_* settings. With `migrated`, a SQLite file not there yet is made as
    `applespec db upgrade` makes it (commands refuse a SQLite path that does not exist)."""
    if migrated:
        from core.store.database import sqlite_file

        path = sqlite_file(db_url)
        if path is not None and not path.exists():
            from migrations import upgrade

            upgrade(db_url)
    env = {
        "APPLESPEC_DATABASE_URL": db_url,
        "APPLESPEC_BROKER_URL": broker_url,
        "APPLESPEC_SWEEP_INTERVAL": "1",
        "APPLESPEC_CHUNK_SIZE": "2",
    }
    env.update(extra)
    return env


class Worker:
    """An `applespec worker` subprocess in its own process group (so it can be SIGKILLed whole).

    `crash`: comma-separated custom_ids the worker process dies on; `item_delay`: seconds
    each item waits as it joins the batch (test hooks: tests/support/hooked_cli.py).
    """

    def __init__(
        self,
        env: dict[str, str],
        model: str,
        log: Path,
        concurrency: int = 1,
        extra: tuple[str, ...] = (),
        crash: str | None = None,
        item_delay: float | None = None,
    ):
        self.log = log
        self.proc = subprocess.Popen(
            hooked_cli.command(
                "worker",
                "--model",
                model,
                "--concurrency",
                str(concurrency),
                *extra,
                "--loglevel",
                "INFO",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                crash=crash,
                item_delay=item_delay,
            ),
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if b" ready." in self.log.read_bytes():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.2)
        raise TimeoutError(f"worker not ready:\n{self.log.read_text()[-3000:]}")

    def owns(self, pid: int) -> bool:
        """Whether `pid` is this worker or one of its pool processes."""
        if pid == self.pid:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return int(stat.rsplit(")", 1)[1].split()[1]) == self.pid

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """Our own redis-server without persistence, to kill and restart mid-job."""

    def __init__(self, port: int, workdir: Path):
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is not installed")
        self.port, self.workdir, self.proc = port, workdir, None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=1).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.1)
        raise TimeoutError("redis-server did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def cli_ok(env: dict[str, str], *args: str) -> str:
    result = CliRunner(env=env).invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result.stdout


def submit(env: dict[str, str], path: Path, model: str, *args: str) -> str:
    out = cli_ok(env, "submit", str(path), "--model", model, *args)
    return out.strip().splitlines()[-1]


def write_prompts(path: Path, ids: list[str], max_tokens: int = 8) -> Path:
    path.write_text(
        "".join(
            json.dumps({"custom_id": i, "prompt": f"prompt {i}", "max_tokens": max_tokens}) + "\n"
            for i in ids
        )
    )
    return path


class Store:
    """Read the job's rows directly (what the workers wrote)."""

    def __init__(self, url: str):
        self.engine = make_engine(url)
        self.sessions = make_sessionmaker(self.engine)

    def job(self, job_id: str) -> Job:
        with self.sessions() as s:
            return s.get(Job, job_id)

    def items(self, job_id: str) -> list[Item]:
        with self.sessions() as s:
            return list(s.scalars(select(Item).where(Item.job_id == job_id).order_by(Item.line)))

    def results_per_item(self, job_id: str) -> dict[int, int]:
        with self.sessions() as s:
            rows = s.execute(
                select(Result.item_id)
                .join(Item, Item.id == Result.item_id)
                .where(Item.job_id == job_id)
            ).scalars()
            counts: dict[int, int] = {}
            for item_id in rows:
                counts[item_id] = counts.get(item_id, 0) + 1
            return counts

    def metrics(self, job_id: str) -> dict[int, Metric]:
        with self.sessions() as s:
            rows = s.scalars(
                select(Metric).join(Item, Item.id == Metric.item_id).where(Item.job_id == job_id)
            )
            return {m.item_id: m for m in rows}

    def wait_for(
        self, predicate, timeout: float, what: str, interval: float = 0.2, job: str | None = None
    ):
        """`predicate()` once truthy; on timeout an error that shows `job`'s items."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(interval)
        raise TimeoutError(f"timed out waiting for {what}" + (self.describe(job) if job else ""))

    def describe(self, job_id: str) -> str:
        """One line per item: status, attempts, lease, queued and started times."""
        return "".join(
            f"\n  item {i.id} line {i.line}: {i.status} attempts={i.attempts} "
            f"lease={i.lease_owner}@{i.lease_expires_at} queued={i.queued_at} "
            f"started={i.started_at} worker={i.worker}"
            for i in self.items(job_id)
        )

    def dispose(self) -> None:
        self.engine.dispose()
