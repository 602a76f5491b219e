"""Warm shutdown reaches the pool processes: finish the item in progress, hand the rest back.

Celery's warm shutdown (SIGTERM to the worker) waits for running tasks but tells them
nothing, so a chunk ran to its end. Here the main process forwards the request to its
pool processes as SIGUSR2; a pool process also takes its own first SIGTERM (systemd's
default stops the whole control group) as the same request. A task asks `requested()`
between items. After the request, a SIGTERM to a pool process stops it at once (Celery's
cold shutdown terminates the pool that way).
"""

from __future__ import annotations

import logging
import os
import signal
import threading

from celery import signals

log = logging.getLogger(__name__)
_requested = threading.Event()
_armed_in: int | None = None  # the pid whose SIGTERM handler is ours


def requested() -> bool:
    """Whether this process was asked to stop taking new items."""
    return _requested.is_set()


def request() -> None:
    _requested.set()


def _on_signal(signum: int, _frame) -> None:
    _requested.set()
    # From now on SIGTERM means "stop now" (the cold shutdown's terminate).
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _in_pool_process(**_kwargs) -> None:
    """A pool process starts: SIGUSR2 from the main process is the stop request."""
    _requested.clear()
    signal.signal(signal.SIGUSR2, _on_signal)


def _before_task(**_kwargs) -> None:
    """The first task of a pool process: its first SIGTERM becomes the stop request too.

    Not at process start: billiard installs its own SIGTERM handler (exit at once) after
    Celery's process initializer has run.
    """
    global _armed_in
    if _armed_in != os.getpid():
        _armed_in = os.getpid()
        signal.signal(signal.SIGTERM, _on_signal)


def _forward(worker):
    def on_shutting_down(sig=None, how=None, **_kwargs) -> None:
        if how != "Warm":
            return
        _requested.set()  # a solo pool runs tasks in this process
        try:
            pids = [p.pid for p in worker.pool._pool._pool]  # prefork: the pool's processes
        except AttributeError:
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGUSR2)
            except (ProcessLookupError, PermissionError):
                pass
        log.info("warm shutdown: asked %d pool process(es) to hand their chunks back", len(pids))

    return on_shutting_down


def install(worker) -> None:
    """In the worker's main process (a bootstep's start): forward warm shutdowns."""
    signals.worker_shutting_down.connect(
        _forward(worker), weak=False, dispatch_uid="applespec-forward-shutdown"
    )


def connect() -> None:
    """Before the pool starts: pool processes install the signal handlers when they start."""
    signals.worker_process_init.connect(
        _in_pool_process, weak=False, dispatch_uid="applespec-pool-shutdown"
    )
    signals.task_prerun.connect(_before_task, weak=False, dispatch_uid="applespec-task-shutdown")


def stop_worker() -> None:
    """Ask this worker to shut down warmly (from a pool process: its parent)."""
    from billiard.process import current_process

    main = current_process()._name == "MainProcess"
    os.kill(os.getpid() if main else os.getppid(), signal.SIGTERM)
