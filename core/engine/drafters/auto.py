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


class AutoDrafter:
    """Per step: the first candidate (n-gram first, then model drafters) whose policy says
    drafting pays at its measured acceptance and that has something to propose; otherwise a
    plain step. Each candidate keeps its own acceptance estimate and draft length."""

    name = "auto"

    def __init__(self, candidates: list[Scheduled]):
        self.candidates = candidates
        self._chosen: Scheduled | None = None

    def begin(self, prompt: list[int]) -> None:
        for c in self.candidates:
            c.begin(prompt)

    def step(self, history: list[int], sampler: DraftSampler) -> Draft:
        self._chosen = None
        for c in self.candidates:
            draft = c.step(history, sampler)
            if draft.length:
                self._chosen = c
                return draft
        return empty_draft()

    def commit(self, draft: Draft, num_accepted: int) -> None:
        if self._chosen is not None:
            self._chosen.commit(draft, num_accepted)
