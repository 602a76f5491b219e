"""Prompt lookup: propose what followed the latest earlier occurrence of the last n tokens.

Matches the last 3 tokens, then 2, then 1, over prompt + output so far, and proposes up to
k tokens that followed the most recent match. Deterministic (`probs=None`). The index is
updated incrementally, O(1) per committed token.
"""

from __future__ import annotations

import mlx.core as mx

from .base import Draft, DraftSampler

NGRAM_SIZES = (3, 2, 1)


class NgramDrafter:
    name = "ngram"

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = sizes
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # positions [0, _indexed) have their n-grams indexed

    def begin(self, prompt: list[int]) -> None:
        self._index.clear()
        self._indexed = 0

    def _update(self, history: list[int]) -> None:
        # Index n-grams ending at e for every e whose continuation e + 1 exists in history,
        # so a lookup of the current suffix finds an earlier occurrence, never itself.
        for e in range(self._indexed, len(history) - 1):
            for n in self.sizes:
                if e + 1 >= n:
                    self._index[tuple(history[e + 1 - n : e + 1])] = e
        self._indexed = max(self._indexed, len(history) - 1)

    def lookup(self, history: list[int], k: int) -> list[int]:
        """Up to `k` tokens that followed the latest earlier match of the longest suffix."""
        self._update(history)
        if k <= 0:
            return []
        for n in self.sizes:
            if len(history) < n:
                continue
            e = self._index.get(tuple(history[-n:]))
            if e is not None:
                # Copy forward like LZ77: a match that overlaps the end extends periodically.
                cont: list[int] = []
                for i in range(e + 1, e + 1 + k):
                    cont.append(history[i] if i < len(history) else cont[i - len(history)])
                return cont
        return []

    def propose(self, history: list[int], k: int, sampler: DraftSampler) -> Draft:
        cont = self.lookup(history, k)
        return Draft(
            tokens=mx.array([cont], dtype=mx.int32).reshape(1, len(cont)), source=self.name
        )

    def commit(self, draft: Draft, num_accepted: int) -> None:
        pass
