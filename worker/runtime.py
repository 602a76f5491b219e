"""What a worker process keeps resident: each model's weights once, engines built on them,
and one engine thread that runs a continuous batch of the items its chunk tasks hand it.

Chunk tasks run in the pool process's main thread: they lease and claim their items, hand
each to `Runtime.submit` and return, so the next chunk arrives while these still run;
several chunks feed one batch. Only the engine thread touches MLX: it is the thread that
first imports it (so mlx-lm's generation stream belongs to it: streams are per thread), and
nothing is loaded before the pool forks (Metal state cannot be forked). Finished items go to the `done`
callback the task gave, which stores them from a writer thread: a row's result is written
as soon as the row finishes, and the engine never waits on the database.

`wait_for_room` keeps a process from taking more than a couple of batches' worth of work
ahead of itself (the rest stays on the broker for other workers); items a warm shutdown
finds still queued here are handed back by `take_back`.
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

BACKLOG_BATCHES = 2  # work taken ahead of the engine: this many batches' rows


@dataclass
class Work:
    """One item handed to the engine thread.

    Attributes:
        key: (model, drafter, k) of the engine that runs it.
        prompt: token ids, or a function of the loaded target giving them (the engine
            thread tokenizes, once the model is loaded).
        params: core.engine GenerationParams, or a function giving them (called on the
            engine thread, which alone imports MLX).
        done: called once, from the engine thread, with (work, result, error).
        isolate: run it alone (an item that was running when its worker died).
        on_admit: called when its row joins the batch (worker/hooks.py: none in production).
        tag: the caller's handle.
        id: what `cancel` names it by (an item id).
        job: its job: rows of one job share a suffix index of the job's answers.
    """

    key: tuple[str, str, int | None]
    prompt: list[int] | Callable[[Any], list[int]]
    params: Any
    done: Callable[[Work, Any, BaseException | None], None]
    isolate: bool = False
    on_admit: Callable[[], None] | None = None
    tag: Any = None
    id: Any = None
    job: Any = None
    submitted: float = field(default_factory=time.perf_counter)


class Cancelled(Exception):
    """The item's job was cancelled: its row was stopped (or never started)."""


class Runtime:
    """Per process: models, engines and the engine thread (see the module docstring)."""

    def __init__(
        self,
        batch_size: int | None = None,
        learn_share: float = 0.0,
        kv_budget: int | None = None,
    ):
        self.batch_size = batch_size
        self.kv_budget = kv_budget  # KV bytes a batch may hold (None: the engine's default)
        self.learn_share = learn_share  # online learning of self-drafters (Engine's `learn`)
        self._models: dict[str, Any] = {}
        self._engines: dict[tuple, Any] = {}
        self._inbox: queue.Queue[Work] = queue.Queue()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._outstanding = 0  # submitted, not yet done
        self._limit = BACKLOG_BATCHES * (batch_size or 64)
        self._thread: threading.Thread | None = None
        self._take_back = threading.Event()
        self._taken: list[Work] = []
        self._stopped = threading.Event()
        self._cancel: set[Any] = set()  # ids of works to drop if not started yet
        self._answers: queue.Queue[tuple] = queue.Queue()  # (engine key, job, texts | None)
        self._alone = 0  # works that must run alone, submitted or waiting to be

    # -- models and engines (engine thread only) --------------------------------------

    def model(self, spec: str):
        """The process's copy of a model's weights, loaded on first use."""
        if spec not in self._models:
            from core.models import load_model

            self._models[spec] = load_model(spec)
        return self._models[spec]

    def engine(self, model: str, draft: str = "auto", k: int | None = None):
        """The Engine for (model, drafter, k), built on the shared weights."""
        key = (model, draft, k)
        if key not in self._engines:
            from core.engine import Engine
            from core.engine import drafters as registry
            from core.training.online import learner_factory

            entry, arg = registry.parse(draft)
            draft_model = self.model(arg) if entry.name == "draft-model" else None
            self._engines[key] = Engine(
                self.model(model),
                draft=draft,
                k=k,
                draft_model=draft_model,
                batch_size=self.batch_size,
                learner=learner_factory(self.learn_share),
                max_kv_bytes=self.kv_budget,
                progress=log.info,  # one-time setup (the verify costs) says what it does
            )
        return self._engines[key]

    # -- the task side ----------------------------------------------------------------

    def submit(self, work: Work) -> None:
        """Queue an item for the engine thread (started on first use)."""
        with self._lock:
            self._outstanding += 1
            if self._thread is None or not self._thread.is_alive():
                self._stopped.clear()
                self._thread = threading.Thread(
                    target=self._loop, name="applespec-engine", daemon=True
                )
                self._thread.start()
                atexit.register(self.close)  # never leave the thread inside MLX at exit
        self._inbox.put(work)

    def close(self, timeout: float = 30.0) -> None:
        """Stop the engine thread once what runs has finished (or after `timeout`)."""
        self.drain(timeout)
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_for_room(self, timeout: float | None = None) -> bool:
        """Block while this process holds a full backlog, or runs a work alone; False on
        timeout."""
        with self._room:
            return self._room.wait_for(
                lambda: self._outstanding < self._limit and not self._alone, timeout
            )

    def submit_alone(
        self, work: Work, timeout: float | None = None, settle: Callable[[], None] | None = None
    ) -> bool:
        """Submit a work that must be the only one in this process (it was in flight when a
        worker died: if it kills this one too, nothing else is charged an attempt). Waits for
        what runs to finish first, then for `settle` (the writer storing their results: a
        result still in memory would die with it); nothing else is taken until it is done.
        False on timeout (nothing submitted)."""
        with self._room:
            self._alone += 1
            if not self._room.wait_for(lambda: self._outstanding == 0, timeout):
                self._alone -= 1
                self._room.notify_all()
                return False
        if settle is not None:
            settle()
        done = work.done

        def release(w, result, error) -> None:
            try:
                done(w, result, error)
            finally:
                with self._room:
                    self._alone -= 1
                    self._room.notify_all()

        work.done = release
        work.isolate = True
        self.submit(work)
        return True

    @property
    def outstanding(self) -> int:
        with self._lock:
            return self._outstanding

    def take_back(self, timeout: float = 10.0) -> list[Work]:
        """The works not yet admitted to a batch, removed (a warm shutdown hands them back);
        rows already running finish."""
        if self._thread is None or not self._thread.is_alive():
            return self._drain_inbox()
        self._take_back.set()
        deadline = time.monotonic() + timeout
        while self._take_back.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        taken, self._taken = self._taken, []
        return taken + self._drain_inbox()

    def cancel(self, ids) -> None:
        """Stop the works with these ids, queued or running (their job was cancelled)."""
        with self._lock:
            self._cancel |= set(ids)

    def share(self, key: tuple, job: Any, texts: list[str]) -> None:
        """Answers of `job` that other workers wrote: the engine for `key` adds them to the
        job's suffix index (on the engine thread, between steps)."""
        if texts:
            self._answers.put((key, job, texts))

    def forget(self, job: Any) -> None:
        """The job is done: every engine drops its suffix index."""
        self._answers.put((None, job, None))

    def _apply_answers(self) -> None:
        while True:
            try:
                key, job, texts = self._answers.get_nowait()
            except queue.Empty:
                return
            if texts is None:
                for engine in self._engines.values():
                    engine.corpora.drop(job)
            elif key in self._engines:
                index = self._engines[key].corpora.get(job)
                for text in texts:
                    index.add(text)

    def drain(self, timeout: float) -> bool:
        """Wait until every submitted item is done; False on timeout."""
        with self._room:
            return self._room.wait_for(lambda: self._outstanding == 0, timeout)

    # -- the engine thread ------------------------------------------------------------

    def _pop_inbox(self) -> list[Work]:
        out = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out

    def _drain_inbox(self) -> list[Work]:
        """Works still in the inbox, removed and no longer outstanding."""
        out = self._pop_inbox()
        self._finished(len(out))
        return out

    def _finished(self, n: int) -> None:
        if n:
            with self._room:
                self._outstanding -= n
                self._room.notify_all()

    def _deliver(self, work: Work, result: Any, error: BaseException | None) -> None:
        try:
            work.done(work, result, error)
        except Exception:  # a storage failure must not stop the engine
            log.exception("storing item %s failed", work.tag)
        finally:
            self._finished(1)

    def _loop(self) -> None:
        batches: dict[tuple, Any] = {}
        while not self._stopped.is_set():
            busy = any(not b.idle for b in batches.values())
            new = []
            if not busy:  # nothing to step: wait for work (waking now and then for take_back)
                try:
                    new.append(self._inbox.get(timeout=0.5))
                except queue.Empty:
                    pass
            new += self._pop_inbox()
            for w in new:
                self._add(batches, w)
            self._apply_answers()
            with self._lock:
                cancel, self._cancel = self._cancel, set()
            if cancel:
                for b in batches.values():
                    for seq in b.drop(lambda q, cancel=cancel: q.tag.id in cancel):
                        self._deliver(seq.tag, None, Cancelled())
            if self._take_back.is_set():
                for b in batches.values():
                    for seq in b.take_queued():
                        self._taken.append(seq.tag)
                        self._finished(1)
                self._take_back.clear()
            for key, b in list(batches.items()):
                if b.idle:
                    continue
                try:
                    for r in b.step():
                        self._deliver(r.tag, r, None)
                except Exception as e:  # an engine failure fails the rows it had
                    log.exception("engine step failed for %s", key)
                    for w in b.abandon():
                        self._deliver(w, None, e)
                    del batches[key]

    def _add(self, batches: dict, w: Work) -> None:
        try:
            engine = self.engine(*w.key)
            self._limit = BACKLOG_BATCHES * engine.batch_size
            b = batches.get(w.key)
            if b is None:
                b = batches[w.key] = engine.new_batch()
            prompt = w.prompt(engine.target) if callable(w.prompt) else w.prompt
            params = w.params() if callable(w.params) else w.params
            b.submit(prompt, params, tag=w, isolate=w.isolate, on_admit=w.on_admit, corpus=w.job)
        except Exception as e:  # a bad model or prompt fails this item alone
            self._deliver(w, None, e)


_runtime: Runtime | None = None


def runtime(
    batch_size: int | None = None, learn_share: float = 0.0, kv_budget: int | None = None
) -> Runtime:
    """This process's Runtime (made on first use, after the fork)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(batch_size or None, learn_share, kv_budget)
    return _runtime
