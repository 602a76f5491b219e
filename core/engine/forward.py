"""The target's forward pass in pieces, over mlx-lm's own modules (no copied weights).

Early exit and verification resume mid-network, so the engine walks `model.model.layers`
itself instead of calling `model(...)`; every piece is exactly what mlx-lm's llama/qwen2
`__call__` does.
"""

from __future__ import annotations

import os
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache, make_prompt_cache


def kv_pad() -> int:
    """Multi-token attention reads are padded to a multiple of this many positions.

    MLX's CUDA backend runs attention over more than one query through cuDNN graphs that
    are built for, and cached by (LRU, 128 entries), the exact key length; a verify step at
    a length not seen lately pays a graph build, and a speculative decoder meets a new
    length nearly every step. Padded, the length changes once every `pad` positions. Metal
    and the CPU have no such cost: 0 (no padding) there. `APPLESPEC_KV_PAD` overrides.
    """
    env = os.environ.get("APPLESPEC_KV_PAD")
    if env is not None:
        if not env.strip().isdigit():
            raise ValueError(f"APPLESPEC_KV_PAD must be a whole number of positions, got {env!r}")
        return int(env)
    return 64 if mx.default_device() == mx.gpu and mx.cuda.is_available() else 0


class PaddedKVCache(KVCache):
    """mlx-lm's KVCache whose multi-token reads cover a whole number of `pad` positions;
    the extra positions are masked out by `make_mask`, so the attention output is the same.
    Single-token reads (plain decoding) are not padded."""

    def __init__(self, pad: int):
        super().__init__()
        self.pad = pad

    def read_width(self, total: int) -> int:
        """Key positions a multi-token read covers once `total` positions are cached."""
        return -(-total // self.pad) * self.pad

    def _reserve(self, keys: mx.array, values: mx.array, size: int) -> None:
        B, H, _, dk = keys.shape
        cap = -(-size // self.step) * self.step
        new_k = mx.zeros((B, H, cap, dk), keys.dtype)
        new_v = mx.zeros((B, H, cap, values.shape[3]), values.dtype)
        if self.keys is not None and self.offset:
            new_k[..., : self.offset, :] = self.keys[..., : self.offset, :]
            new_v[..., : self.offset, :] = self.values[..., : self.offset, :]
        self.keys, self.values = new_k, new_v

    def update_and_fetch(self, keys: mx.array, values: mx.array):
        n = keys.shape[2]
        if n == 1:
            return super().update_and_fetch(keys, values)
        prev, width = self.offset, self.read_width(self.offset + n)
        if self.keys is None or width > self.keys.shape[2]:
            self._reserve(keys, values, width)
        self.offset = prev + n
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        return self.keys[..., :width, :], self.values[..., :width, :]

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None):
        if n == 1 or window_size is not None:
            return super().make_mask(n, return_array=return_array, window_size=window_size)
        total = self.offset + n  # called before this step's update
        rows = mx.arange(self.offset, total)[:, None]
        return mx.arange(self.read_width(total))[None] <= rows  # causal; padding masked


def make_cache(model: nn.Module) -> list[Any]:
    """One mlx-lm KV cache per layer (trimmable: rollback = lower the offset); padded
    multi-token reads where the backend needs them (`kv_pad`)."""
    cache, pad = make_prompt_cache(model), kv_pad()
    if pad > 1 and all(type(c) is KVCache for c in cache):
        return [PaddedKVCache(pad) for _ in cache]
    return cache


def read_width(cache: Any, total: int) -> int:
    """Key positions the cache returns for a multi-token step ending at `total`."""
    return cache.read_width(total) if isinstance(cache, PaddedKVCache) else total


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


def last_logits(model: nn.Module, tokens: mx.array, cache: list[Any]) -> mx.array:
    """The whole model on (B, L) ids, logits for the last position only: (B, V).

    Prefills and a draft model's catch-up need no logits for the other positions, and the
    output projection is the largest matmul of a small model (SmolLM2: ~1/5 of its weights;
    Qwen2.5-Coder-0.5B: ~1/4), so it runs on one row."""
    h = run_layers(model, embed(model, tokens), cache)
    return lm_head(model, h[:, -1:])[:, 0]


def trim(cache: list[Any], n: int) -> None:
    """Drop the last `n` positions of every layer's cache (rejected draft tokens)."""
    if n > 0:
        for c in cache:
            c.trim(n)
