"""Scheduling drafters: a drafter plus its draft-length policy, and `auto`, which picks one
per step from what it has measured on this request."""

from __future__ import annotations

import mlx.core as mx

from .base import Draft, Drafter, DraftSampler


def empty_draft() -> Draft:
    return Draft(tokens=mx.zeros((1, 0), mx.int32), source="none")


class Scheduled:
    """One drafter with its length policy (`FixedK` or `AdaptiveK`)."""

    def __init__(self, drafter: Drafter, policy):
        self.drafter = drafter
        self.policy = policy
        self.name = drafter.name

    def begin(self, prompt: list[int]) -> None:
        self.drafter.begin(prompt)

    def step(self, history: list[int], sampler: DraftSampler) -> Draft:
        k = self.policy.next()
        return self.drafter.propose(history, k, sampler) if k > 0 else empty_draft()

    def commit(self, draft: Draft, num_accepted: int) -> None:
        if draft.length:
            self.drafter.commit(draft, num_accepted)
            self.policy.update(draft.length, num_accepted)

    def promise(self) -> float:
        """Expected tokens per unit of time this drafter offers (its policy's estimate)."""
        return self.policy.promise()


class AutoDrafter:
    """Per step: the candidates in order of what they promise (expected tokens per unit of
    time from their measured acceptance, draft cost included; n-gram first on ties), and the
    first one that drafts something is used; otherwise a plain step. A prompt-lookup miss
    costs nothing, so the next candidate still gets its turn. Each candidate keeps its own
    acceptance statistics and draft length."""

    name = "auto"

    def __init__(self, candidates: list[Scheduled]):
        self.candidates = candidates
        self._chosen: Scheduled | None = None

    def begin(self, prompt: list[int]) -> None:
        for c in self.candidates:
            c.begin(prompt)

    def step(self, history: list[int], sampler: DraftSampler) -> Draft:
        self._chosen = None
        for c in sorted(self.candidates, key=lambda c: -c.promise()):
            draft = c.step(history, sampler)
            if draft.length:
                self._chosen = c
                return draft
        return empty_draft()

    def commit(self, draft: Draft, num_accepted: int) -> None:
        if self._chosen is not None:
            self._chosen.commit(draft, num_accepted)
