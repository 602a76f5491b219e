"""A separate small model sharing the target's tokenizer drafts k tokens autoregressively."""

from __future__ import annotations

import mlx.core as mx

from ..forward import forward, last_logits, make_cache, trim
from ..model import LoadedModel
from .base import Draft, DraftSampler


class DraftModelDrafter:
    def __init__(self, draft: LoadedModel):
        self.draft = draft
        self.name = f"draft-model:{draft.name}"
        self.cache = make_cache(draft.model)
        self._seen = 0  # tokens of history held in the draft cache

    def begin(self, prompt: list[int]) -> None:
        self.cache = make_cache(self.draft.model)
        self._seen = 0

    def propose(self, history: list[int], k: int, sampler: DraftSampler) -> Draft:
        model = self.draft.model
        fresh = mx.array([history[self._seen :]], dtype=mx.int32)  # (1, n_new)
        tokens, probs = [], []
        self._pending = 0
        if k:
            logits = last_logits(model, fresh, self.cache)
            for i in range(k):
                t, q = sampler(logits)
                tokens.append(t)
                if q is not None:
                    probs.append(q)
                if i + 1 < k:
                    logits = forward(model, t[:, None], self.cache)[:, -1]
            self._seen = len(history) + k - 1
        return Draft(
            tokens=mx.stack(tokens, axis=1) if tokens else mx.zeros((1, 0), mx.int32),
            probs=mx.stack(probs, axis=1) if probs else None,
            source=self.name,
        )

    def commit(self, draft: Draft, num_accepted: int) -> None:
        k = draft.length
        if k == 0:
            return
        # The cache holds history + d1..d(k-1); keep history + d1..dn.
        drop = max(0, (k - 1) - num_accepted)
        trim(self.cache, drop)
        self._seen -= drop
