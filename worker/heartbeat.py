"""A process's heartbeat: a thread that keeps the leases of the items it holds alive.

Tell it which items this process holds (`hold`) and lets go of (`drop`); every
`interval` seconds it renews their leases (`repo.renew_leases`). When the process dies the
beats stop, the leases run out and the sweeper re-queues the items. The continuous-batch
engine holds many items from several chunks at once: it calls `hold` as it admits them and
`drop` as it retires them; `hold` returns only the items this process did not hold yet, so
an item redelivered in a second chunk never runs twice here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from core.store import repo
from core.store.database import StoreGone

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews `worker`'s leases on the held items every `interval` seconds, in a thread.

    Args:
        sessions: a sessionmaker for the store.
        worker: the lease owner, `host:pid` of this process.
        lease_s: how far ahead each renewal extends a lease.
        interval: seconds between renewals (under half of `lease_s`).
        on_store_gone: called once if the SQLite file disappears (the process must stop).
        on_cancelled: called with the held items whose job is being cancelled (the engine
            drops those it has not started).
    """

    def __init__(
        self,
        sessions,
        worker: str,
        lease_s: float,
        interval: float,
        on_store_gone: Callable[[StoreGone], None] | None = None,
        on_cancelled: Callable[[set[int]], None] | None = None,
    ):
        self.sessions = sessions
        self.worker = worker
        self.lease_s = lease_s
        self.interval = interval
        self.on_store_gone = on_store_gone
        self.on_cancelled = on_cancelled
        self._held: dict[int, None] = {}  # insertion-ordered set
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, item_ids: Iterable[int]) -> list[int]:
        """Start renewing these items; returns those not already held, in order."""
        with self._lock:
            new = [i for i in item_ids if i not in self._held]
            self._held.update(dict.fromkeys(new))
        self.start()
        return new

    def drop(self, item_ids: Iterable[int]) -> None:
        """Stop renewing these items (finished, failed, handed back)."""
        with self._lock:
            for i in item_ids:
                self._held.pop(i, None)

    def held(self) -> list[int]:
        with self._lock:
            return list(self._held)

    def beat(self) -> set[int]:
        """Renew the held leases now; returns the items whose lease was lost (dropped)."""
        ids = self.held()
        if not ids:
            return set()
        with self.sessions() as session:
            renewed = repo.renew_leases(session, self.worker, ids, self.lease_s)
            cancelled = repo.cancelled_items(session, renewed) if self.on_cancelled else set()
        if cancelled:
            self.on_cancelled(cancelled)
        with self._lock:  # only what is still held: an item may have finished meanwhile
            lost = {i for i in ids if i not in renewed and i in self._held}
            for i in lost:
                self._held.pop(i)
        if lost:
            log.warning(
                "%s no longer holds %d item(s) %s: done or cancelled meanwhile, or taken over "
                "after missed heartbeats",
                self.worker,
                len(lost),
                sorted(lost)[:10],
            )
        return lost

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="applespec-heartbeat", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.beat()
            except StoreGone as e:
                log.error("heartbeat stopped: %s", e)
                if self.on_store_gone is not None:
                    self.on_store_gone(e)
                return
            except Exception as e:  # database unreachable: the next beat tries again
                log.warning("heartbeat skipped: %s: %s", type(e).__name__, e)
