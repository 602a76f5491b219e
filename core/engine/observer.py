"""What a batch reports of each step to those who watch it (the step modes, the bench,
tests): one `StepReport` per `Batch.step`, handed to every observer in turn."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class StepReport:
    """One batch step.

    Attributes:
        kind: the step modes' kind that was current ("draft" | "loop" | "plain").
        runner: what ran: "synced" (host-synced drafting, or one token a row where a row
            needs the host), "loop" (the resident loop) or "plain" (double-buffered).
        decoding: a row was decoding as the step began (else it only prefilled prompts).
        entry: the first step of a double-buffered kind, with none of its own to read.
        tokens: tokens emitted, less those an earlier step of another kind computed.
        seconds: the step's time by the engine's clock, less the waits for those.
        rows: live rows after the step.
        prefill_tokens: prompt tokens the step prefilled.
        drafters: the drafters a host-synced step's rows chose among.
        drafted: draft nodes verified in the step's commits.
        accepted: of those, the ones accepted.
        drained: (kind, tokens, seconds) that an earlier step of `kind` computed and this
            one read.
        phases: wall seconds by part of the step (a runner's parts: step_synced.py's
            "plan", "draft", "forward", "overlap", "sync", "commit"; the plain and loop
            runners' whole step).
    """

    kind: str = "draft"
    runner: str = "synced"
    decoding: bool = False
    entry: bool = False
    tokens: int = 0
    seconds: float = 0.0
    rows: int = 0
    prefill_tokens: int = 0
    drafters: tuple[str, ...] = ()
    drafted: int = 0
    accepted: int = 0
    drained: list[tuple[str, int, float]] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)


StepObserver = Callable[[StepReport], None]


class PhaseTotals:
    """An observer summing the steps' `phases`: wall seconds and steps by part."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()

    def __call__(self, report: StepReport) -> None:
        for part, sec in report.phases.items():
            self.seconds[part] += sec
            self.calls[part] += 1

    def clear(self) -> None:
        self.seconds.clear()
        self.calls.clear()
