"""Self-drafting by early exit: the target's first L layers + its final norm + its LM head.

No weight copies and no cache of its own: the draft's KV entries for layers < L are the
target's cache entries, and verification resumes at layer L from the hidden states the
draft already computed (LayerSkip's exit-query reuse). Rollback is the engine's trim.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn

from ..forward import embed, lm_head, run_layers
from .base import Draft, DraftSampler


class EarlyExitDrafter:
    def __init__(self, model: nn.Module, cache: list[Any], exit_layer: int):
        n = len(model.model.layers)
        if not 0 < exit_layer < n:
            raise ValueError(f"early-exit layer must be between 1 and {n - 1}, got {exit_layer}")
        self.model = model
        self.cache = cache  # the target's cache, shared
        self.exit_layer = exit_layer
        self.name = f"early-exit:{exit_layer}"

    def begin(self, prompt: list[int]) -> None:
        pass

    def propose(self, history: list[int], k: int, sampler: DraftSampler) -> Draft:
        L = self.exit_layer
        tok = mx.array([[history[-1]]], dtype=mx.int32)  # (1, 1)
        hidden, tokens, probs = [], [], []
        for i in range(k + 1):
            h = run_layers(self.model, embed(self.model, tok), self.cache, 0, L)  # (1, 1, D)
            hidden.append(h)
            if i == k:
                break
            t, q = sampler(lm_head(self.model, h)[:, -1])  # (1,), (1, V) | None
            tokens.append(t)
            if q is not None:
                probs.append(q)
            tok = t[:, None]
        return Draft(
            tokens=mx.stack(tokens, axis=1) if tokens else mx.zeros((1, 0), mx.int32),
            probs=mx.stack(probs, axis=1) if probs else None,
            hidden=mx.concatenate(hidden, axis=1),  # (1, k + 1, D)
            start_layer=L,
            source=self.name,
        )

    def commit(self, draft: Draft, num_accepted: int) -> None:
        pass  # the engine trims the shared cache
