"""The model a worker process keeps resident: loaded on its first task, after the fork."""

from __future__ import annotations

from typing import Any

_engines: dict[tuple[str, str, int | None], Any] = {}


def engine_for(model: str, draft: str = "auto", k: int | None = None) -> Any:
    """The process's Engine for (model, drafter, k), loaded once (Metal state cannot be forked,
    so the parent never loads one; each pool process loads on first use)."""
    key = (model, draft, k)
    if key not in _engines:
        from core.engine import Engine

        _engines[key] = Engine.load(model, draft=draft, k=k)
    return _engines[key]
