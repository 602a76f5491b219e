"""What the engine asks of an online learner, and how it is handed one.

A learner trains the serving self-drafter (an early-exit adapter or the feature head) on the
rows the engine finishes, between batch steps, and swaps improved weights into the very
`Adapter` the drafters read. The engine builds it from a factory the caller passes
(`Engine(learner=...)`; core/training/online.py's `learner_factory`) once it knows which
adapter serves: the engine depends on this protocol only, never on the training code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn

from .adapters.block import Adapter


class Learner(Protocol):
    """Online learning of a serving adapter, as the engine drives it."""

    version: int  # the serving adapter's version: the swaps so far (a row's metrics report it)

    def observe(
        self, prompt: list[int], answer: list[int], states: list[mx.array] | None = None
    ) -> None:
        """A finished row: its prompt, the tokens it emitted and, for a feature head, the
        target's last-layer states the engine kept for them (else None)."""

    def tick(self) -> bool:
        """One unit of work between batch steps when the time budget allows; whether it
        did one."""


# (the frozen target's mlx-lm model, the serving adapter) -> its learner
LearnerFactory = Callable[[nn.Module, Adapter], Learner]
