"""The drafter interface: every proposer (n-gram, early exit, draft model, trained adapters,
trees) hands the engine a `Draft`, and one acceptance routine decides what to keep."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx


@dataclass
class Draft:
    """Candidate tokens for one verify step.

    A chain is the common case: `tokens[:, i]` follows `tokens[:, i-1]`. A tree sets `parents`.

    Attributes:
        tokens: (B, K) int32 proposed tokens; K may be 0 (plain decoding step).
        probs: (B, K, V) draft distribution each token was sampled from, or None for
            deterministic drafters (treated as one-hot on `tokens`).
        hidden: (B, K + 1, D) hidden states at layer `start_layer` for [last token, tokens...],
            when the drafter already ran the target's first layers (early exit), else None.
        start_layer: the layer verification resumes at when `hidden` is given.
        parents: (K,) int32 parent index of each node (-1 = the root, i.e. the last committed
            token) for tree drafts; None for a chain.
        source: the drafter that produced it (metrics attribute acceptance to it).
    """

    tokens: mx.array  # (B, K)
    probs: mx.array | None = None  # (B, K, V)
    hidden: mx.array | None = None  # (B, K + 1, D)
    start_layer: int = 0
    parents: mx.array | None = None  # (K,)
    source: str = ""

    @property
    def length(self) -> int:
        return self.tokens.shape[1]


class DraftSampler(Protocol):
    """Turns (B, V) draft logits into (tokens (B,), probs (B, V) or None when greedy)."""

    def __call__(self, logits: mx.array) -> tuple[mx.array, mx.array | None]: ...


class Drafter(Protocol):
    """What the engine asks of a drafter.

    Lifecycle per request: `begin(prompt)`, then per verify step `propose(...)` followed by
    `commit(...)` with what the target accepted.
    """

    name: str

    def begin(self, prompt: list[int]) -> None:
        """Start a request whose prompt is `prompt` (already prefilled in the target cache)."""

    def propose(self, history: list[int], k: int, sampler: DraftSampler) -> Draft:
        """Propose up to `k` tokens following `history` (prompt + committed output).

        `history[-1]` is the last committed token: it is not yet in the target cache.
        """

    def commit(self, draft: Draft, num_accepted: int) -> None:
        """The target kept `num_accepted` of the proposed tokens: roll any own state back."""
