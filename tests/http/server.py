"""An `applespec serve` subprocess for tests, on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.worker.service import ROOT, free_port


class Server:
    """`applespec serve --port PORT` in its own process group; `url` is its base URL."""

    def __init__(self, env: dict[str, str], log: Path, host: str = "127.0.0.1"):
        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from api.cli import main; main()",
                "serve",
                "--host",
                host,
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=open(log, "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log.read_text()[-3000:]}")
            try:
                httpx.get(self.url + "/dashboard/state", timeout=2)
                return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise TimeoutError(f"server not ready:\n{self.log.read_text()[-3000:]}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
