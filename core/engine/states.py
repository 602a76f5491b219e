"""The target's last-layer states a row keeps for a drafter that reads them (the feature head),
held by reference: a row keeps spans of its steps' output arrays, and a reader gathers the
spans of many rows with one concatenate and one take.

A row that decoded 60 plain steps holds 60 one-position spans; slicing and concatenating them
row by row would queue two operations per span (on a GPU each is a kernel launch: ~8k for a
64-row batch catching up after a stretch of plain steps), where a gather queues two in all.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import mlx.core as mx


@dataclass(frozen=True)
class Span:
    """Positions [start, start + count) of one step's (N, D) states."""

    src: mx.array
    start: int
    count: int


def count(spans: Iterable[Span]) -> int:
    """Positions the spans hold."""
    return sum(s.count for s in spans)


def gather(spans: list[Span]) -> mx.array:
    """(count(spans), D): the spans' states in order (each distinct source array once)."""
    srcs: list[mx.array] = []
    base: dict[int, int] = {}  # id(src) -> its first row in the concatenation
    idx: list[int] = []
    end = 0
    for s in spans:
        at = base.get(id(s.src))
        if at is None:
            at = base[id(s.src)] = end
            end += s.src.shape[0]
            srcs.append(s.src)
        idx.extend(range(at + s.start, at + s.start + s.count))
    h = srcs[0] if len(srcs) == 1 else mx.concatenate(srcs)
    if len(idx) == h.shape[0] and idx == list(range(len(idx))):
        return h
    return h[mx.array(idx, mx.int32)]
