"""Run by test_mac_safe in a fresh interpreter: where MLX is imported and evaluated when a
worker process runs items. Prints one JSON line."""

import importlib.abc
import json
import os
import sys
import threading

first: dict[str, str] = {}


class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name in ("mlx.core", "mlx_lm.generate") and name not in first:
            first[name] = threading.current_thread().name
        return None


sys.meta_path.insert(0, Watch())

import worker.tasks  # noqa: E402, F401 - what a worker process imports before its first task
from core.jobs import JobRequest, generation_params  # noqa: E402
from worker.runtime import Runtime, Work  # noqa: E402

loaded_early = sorted(m for m in sys.modules if m.startswith(("mlx", "core.engine")))
rt = Runtime(4)
finished = threading.Semaphore(0)
errors: list[str] = []
evals: set[str] = set()


def done(w, r, e):
    if e is not None:
        errors.append(repr(e))
    finished.release()


def work(n: int) -> Work:
    request = JobRequest(line=n, custom_id=f"c{n}", prompt=f"item {n}")
    request.params["max_tokens"] = 4
    return Work(
        key=("tiny-random:3", "none", None),
        prompt=lambda target: target.encode_prompt(f"item {n}"),
        params=lambda: generation_params(request),  # as worker.tasks hands them over
        done=done,
        tag=n,
        id=n,
    )


rt.submit(work(0))
finished.acquire(timeout=240)
import mlx.core as mx  # noqa: E402 - loaded by now, on the engine thread

for name in ("eval", "async_eval"):
    real = getattr(mx, name)

    def spy(*a, _real=real, **k):
        evals.add(threading.current_thread().name)
        return _real(*a, **k)

    setattr(mx, name, spy)
for n in (1, 2):
    rt.submit(work(n))
for _ in (1, 2):
    finished.acquire(timeout=240)
rt.close()
print(
    json.dumps(
        {
            "loaded_early": loaded_early,
            "imported_on": first,
            "eval_threads": sorted(evals),
            "errors": errors,
        }
    ),
    flush=True,
)
# MLX's own threads can abort an interpreter's teardown ("terminate called without an
# active exception"): what this probe shows is printed, so leave at once.
os._exit(0)
