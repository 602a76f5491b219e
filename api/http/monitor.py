"""What the broker knows: the workers online (Celery inspect) and the chunks queued per queue.

`inspect` waits its whole timeout for replies, so a background thread asks every few
seconds and pages read the last answer; a page never waits on the broker.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

# kombu's Redis transport keeps a queue's messages of priority > 0 under these suffixes.
_PRIORITY_SUFFIXES = ("", "\x06\x163", "\x06\x166", "\x06\x169")


class FarmMonitor:
    """Polls the broker in a thread; `snapshot()` is the latest view.

    Args:
        settings: the broker URL comes from here.
        known_queues: called each round for the queues of unfinished jobs (from SQL), so a
            queue nobody consumes still shows its depth.
        interval: seconds between rounds.
    """

    def __init__(self, settings, known_queues: Callable[[], Iterable[str]], interval: float = 3.0):
        self.settings, self.known_queues, self.interval = settings, known_queues, interval
        self._snapshot: dict[str, Any] = {"workers": [], "queues": {}, "checked_at": None}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._app = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="farm-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._snapshot)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                view = self.poll()
            except Exception as e:  # broker down: say so, keep the last known workers out
                view = {"workers": [], "queues": {}, "error": f"{type(e).__name__}: {e}"}
            view["checked_at"] = time.time()
            with self._lock:
                self._snapshot = view
            self._stop.wait(self.interval)

    def poll(self) -> dict[str, Any]:
        """One round: who answers `inspect`, what they consume, and every queue's depth."""
        import redis

        from worker.app import create_app

        if self._app is None:
            self._app = create_app(self.settings)
        replies = self._app.control.inspect(timeout=1.0).active_queues() or {}
        workers = [
            {"name": name, "queues": sorted(q["name"] for q in queues)}
            for name, queues in sorted(replies.items())
        ]
        names = {q for w in workers for q in w["queues"]} | set(self.known_queues())
        client = redis.Redis.from_url(self.settings.broker_url, socket_timeout=2)
        try:
            depth = {
                q: sum(client.llen(q + suffix) for suffix in _PRIORITY_SUFFIXES)
                for q in sorted(names)
            }
        finally:
            client.close()
        return {"workers": workers, "queues": depth, "error": None}
