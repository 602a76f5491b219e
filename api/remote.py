"""A Python client for pipelines on other machines: the HTTP API, a base URL and a key.

    from api.remote import RemoteClient

    farm = RemoteClient("http://farm.local:8000", key="as-...")
    batch = farm.submit([{"custom_id": "q1", "prompt": "Label: great movie ->",
                          "max_tokens": 8}])
    farm.wait(batch["id"], progress=True)           # progress with ETA on stderr
    for line in farm.results(batch["id"]):           # streamed, never all in memory
        print(line["custom_id"], line["response"]["body"]["choices"][0])

It needs no database or broker credentials: only what `applespec serve` exposes
(OpenAI's Batch and Files API, plus `/v1/batches/{id}/status` and `/retry`). Lines
are OpenAI Batch input lines or the short prompt form; bad lines come back as errors
(`errors()`), as with `applespec submit`. For work on the farm's own machine,
`api.client.Client` talks to the store and broker directly.
"""

from __future__ import annotations

import io
import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

DONE = ("completed", "failed", "cancelled", "expired")


class RemoteError(RuntimeError):
    """The server refused a request: its HTTP status and OpenAI error body."""

    def __init__(self, status: int, error: Mapping[str, Any]):
        super().__init__(f"{status}: {error.get('message')}")
        self.status, self.error = status, dict(error)


class RemoteTimeout(TimeoutError):
    """`wait` ran out of time before the batch finished."""


class RemoteClient:
    """Submit batches, follow them, stream their results, cancel and retry them over HTTP."""

    def __init__(self, base_url: str, key: str | None = None, timeout: float = 60.0):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = httpx.Client(
            base_url=base_url.rstrip("/") + "/v1", headers=headers, timeout=timeout
        )

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        r = self.http.request(method, path, **kwargs)
        if r.status_code >= 400:
            try:
                error = r.json()["error"]
            except (ValueError, KeyError, TypeError):
                error = {"message": r.text[:500]}
            raise RemoteError(r.status_code, error)
        return r.json()

    def submit(
        self,
        requests: str | Path | Iterable[Mapping[str, Any]],
        *,
        endpoint: str = "/v1/chat/completions",
        metadata: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """Upload the lines (a JSONL path, or dicts) and create a batch; the Batch object."""
        if isinstance(requests, (str, Path)):
            with open(requests, "rb") as f:
                data, name = f.read(), Path(requests).name
        else:
            data = b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in requests)
            name = "requests.jsonl"
        file = self._call(
            "POST",
            "/files",
            files={"file": (name, io.BytesIO(data))},
            data={"purpose": "batch"},
        )
        body: dict[str, Any] = {
            "input_file_id": file["id"],
            "endpoint": endpoint,
            "completion_window": "24h",
        }
        if metadata:
            body["metadata"] = dict(metadata)
        return self._call("POST", "/batches", json=body)

    def batch(self, batch_id: str) -> dict[str, Any]:
        """The Batch object (OpenAI's)."""
        return self._call("GET", f"/batches/{batch_id}")

    def status(self, batch_id: str) -> dict[str, Any]:
        """`applespec status --json` of the batch: counts, `eta`, `energy`, metrics."""
        return self._call("GET", f"/batches/{batch_id}/status")

    def wait(
        self,
        batch_id: str,
        timeout: float | None = None,
        interval: float = 1.0,
        progress: bool = False,
    ) -> dict[str, Any]:
        """Poll until the batch is finished; its final Batch object. With `progress`, a
        line on stderr: done/total and the ETA from the job's measured rate.

        Raises:
            RemoteTimeout: after `timeout` seconds.
        """
        from core.store.repo import duration

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            status = self.status(batch_id)
            if progress:
                c = status["request_counts"]
                eta = status["eta"]["seconds"]
                shown = f", ETA {duration(eta)}" if eta is not None else ""
                print(
                    f"\r{batch_id}: {status['status']} {c['completed'] + c['failed']}/"
                    f"{c['total']}{shown}   ",
                    end="\n" if status["status"] in DONE else "",
                    file=sys.stderr,
                    flush=True,
                )
            if status["status"] in DONE:
                return self.batch(batch_id)
            if deadline is not None and time.monotonic() >= deadline:
                raise RemoteTimeout(f"{batch_id} is still {status['status']}")
            time.sleep(interval)

    def _lines(self, file_id: str | None) -> Iterator[dict[str, Any]]:
        if file_id is None:
            return
        with self.http.stream("GET", f"/files/{file_id}/content") as r:
            if r.status_code >= 400:
                r.read()
                raise RemoteError(r.status_code, r.json().get("error", {}))
            for line in r.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def results(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """The finished batch's output lines, in input order, streamed as they download."""
        yield from self._lines(self._finished(batch_id)["output_file_id"])

    def errors(self, batch_id: str) -> Iterator[dict[str, Any]]:
        """The finished batch's error lines (bad input lines, failed and cancelled requests)."""
        yield from self._lines(self._finished(batch_id)["error_file_id"])

    def _finished(self, batch_id: str) -> dict[str, Any]:
        batch = self.batch(batch_id)
        if batch["status"] not in DONE:
            raise RemoteError(409, {"message": f"{batch_id} is still {batch['status']}"})
        return batch

    def cancel(self, batch_id: str) -> dict[str, Any]:
        """Cancel (`applespec cancel`: queued requests dropped now, running ones at their
        worker's next heartbeat); the Batch object."""
        return self._call("POST", f"/batches/{batch_id}/cancel")

    def retry(self, batch_id: str) -> int:
        """Resume a batch: its failed and cancelled requests queued again; how many."""
        return self._call("POST", f"/batches/{batch_id}/retry")["requeued"]
