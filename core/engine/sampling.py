"""Generation parameters and the target distribution they define.

Greedy (temperature 0) is argmax of the raw logits. Otherwise the target distribution is
softmax(logits / T) restricted by top-k and top-p (mlx-lm's own filters); speculative
sampling reproduces exactly that distribution, and draft models sample from the same
transform of their own logits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.sample_utils import apply_top_k, apply_top_p


@dataclass
class GenerationParams:
    """What a request asks for.

    Attributes:
        max_tokens: most tokens to generate (the EOS token is not counted or returned).
        temperature: 0 = greedy.
        top_p: nucleus mass in (0, 1]; 1 = off.
        top_k: keep the k most likely tokens; 0 = off.
        seed: makes sampling reproducible; None = fresh randomness.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def log_target(logits: mx.array, params: GenerationParams) -> mx.array:
    """(..., V) logits -> (..., V) log-probabilities of the target distribution (float32)."""
    logits = logits.astype(mx.float32) / params.temperature
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    vocab = logprobs.shape[-1]
    if 0 < params.top_k < vocab:
        logprobs = apply_top_k(logprobs, params.top_k)
    if params.top_p < 1.0:
        logprobs = apply_top_p(logprobs, params.top_p)
    return logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)


class KeyStream:
    """A reproducible stream of PRNG keys (one request, one stream)."""

    def __init__(self, seed: int | None):
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        self._key = mx.random.key(seed)

    def next(self) -> mx.array:
        self._key, sub = mx.random.split(self._key)
        return sub


def make_draft_sampler(params: GenerationParams, keys: KeyStream):
    """A `DraftSampler`: greedy drafts are argmax with probs None; sampled drafts carry q."""
    if params.greedy:

        def greedy(logits: mx.array) -> tuple[mx.array, None]:
            return mx.argmax(logits, axis=-1), None

        return greedy

    def sample(logits: mx.array) -> tuple[mx.array, mx.array]:
        logq = log_target(logits, params)  # (B, V)
        return mx.random.categorical(logq, key=keys.next()), mx.exp(logq)

    return sample
