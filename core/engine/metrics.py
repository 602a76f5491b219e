"""Per-request speculative and timing metrics (what gpt-fast calls accept_counts, and more)."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import mlx.core as mx


@dataclass
class RequestMetrics:
    drafter: str
    shared_prefix: int = 0  # prompt tokens copied from another row's cache, not computed
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    emitted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    steps_by_source: Counter = field(default_factory=Counter)
    drafted_by_source: Counter = field(default_factory=Counter)  # draft tokens proposed
    accepted_by_source: Counter = field(default_factory=Counter)  # of them, accepted
    phases: dict[str, float] = field(
        default_factory=lambda: {"draft_s": 0.0, "verify_s": 0.0, "accept_s": 0.0, "cache_s": 0.0}
    )
    t_start: float = field(default_factory=time.perf_counter)
    t_first: float | None = None
    t_end: float | None = None

    def record_step(self, source: str, proposed: int, accepted: int, emitted: int) -> None:
        self.verify_steps += 1
        self.draft_tokens += proposed
        self.accepted_tokens += accepted
        self.emitted_tokens += emitted
        self.steps_by_source[source or "none"] += 1
        if proposed:
            self.drafted_by_source[source] += proposed
            self.accepted_by_source[source] += accepted
        if len(self.accepted_per_position) < proposed:
            self.accepted_per_position += [0] * (proposed - len(self.accepted_per_position))
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def speculative(self) -> dict:
        return {
            "drafter": self.drafter,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "verify_steps": self.verify_steps,
            "acceptance_rate": self.accepted_tokens / self.draft_tokens
            if self.draft_tokens
            else 0.0,
            "mean_accepted_length": (
                self.emitted_tokens / self.verify_steps if self.verify_steps else 0.0
            ),
            "accepted_per_position": list(self.accepted_per_position),
            "steps_by_drafter": dict(self.steps_by_source),
            "draft_tokens_by_drafter": dict(self.drafted_by_source),
            "accepted_by_drafter": dict(self.accepted_by_source),
        }

    def timing(self, generated: int) -> dict:
        end = self.t_end or time.perf_counter()
        first = self.t_first or end
        total = end - self.t_start
        decode = end - first
        phases = {k: round(v, 6) for k, v in self.phases.items()}
        return {
            "ttft_s": round(first - self.t_start, 6),
            "shared_prefix_tokens": self.shared_prefix,
            "decode_tokens_per_s": (generated - 1) / decode
            if generated > 1 and decode > 0
            else 0.0,
            **phases,
            "total_s": round(total, 6),
            "peak_memory_bytes": int(mx.get_peak_memory()),
        }


class Phase:
    """Adds the wall time of a block to one of the metrics' phases. With profiling on, the
    block's arrays are evaluated inside it, so the time is the phase's own compute."""

    def __init__(self, metrics: RequestMetrics, name: str):
        self.metrics, self.name = metrics, name

    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.metrics.phases[self.name] += time.perf_counter() - self.t0
        return False
