"""The target's forward pass in pieces, over mlx-lm's own modules (no copied weights).

Early exit and verification resume mid-network, so the engine walks `model.model.layers`
itself instead of calling `model(...)`; every piece is exactly what mlx-lm's llama/qwen2
`__call__` does.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import make_prompt_cache


def make_cache(model: nn.Module) -> list[Any]:
    """One mlx-lm KV cache per layer (trimmable: rollback = lower the offset)."""
    return make_prompt_cache(model)


def embed(model: nn.Module, tokens: mx.array) -> mx.array:
    """(B, L) token ids -> (B, L, D) input embeddings."""
    return model.model.embed_tokens(tokens)


def run_layers(
    model: nn.Module, h: mx.array, cache: list[Any], start: int = 0, stop: int | None = None
) -> mx.array:
    """Run layers [start, stop) on (B, L, D) hidden states, appending to their caches."""
    layers = model.model.layers[start:stop]
    caches = cache[start : start + len(layers)]
    mask = create_attention_mask(h, caches[0])
    for layer, c in zip(layers, caches, strict=True):
        h = layer(h, mask, cache=c)
    return h


def lm_head(model: nn.Module, h: mx.array) -> mx.array:
    """Final norm + output projection: (B, L, D) -> (B, L, V) logits."""
    h = model.model.norm(h)
    if hasattr(model, "lm_head"):
        return model.lm_head(h)
    return model.model.embed_tokens.as_linear(h)  # tied embeddings


def forward(model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
    """The whole model: (B, L) ids -> (B, L, V) logits."""
    return lm_head(model, run_layers(model, embed(model, tokens), cache))


def trim(cache: list[Any], n: int) -> None:
    """Drop the last `n` positions of every layer's cache (rejected draft tokens)."""
    if n > 0:
        for c in cache:
            c.trim(n)
