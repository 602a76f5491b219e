"""Generation parameters and the target distribution they define.

The target's logits are first adjusted as OpenAI defines it: `logit_bias` added, and for each
token already generated `frequency_penalty` times its count plus `presence_penalty` once
subtracted (`adjustments`). Greedy (temperature 0) is the argmax of the adjusted logits;
otherwise the target distribution is softmax(adjusted / T) restricted by top-k and top-p
(mlx-lm's own filters). The adjustment of a draft node counts the tokens on its path, so
verification scores every node exactly as plain decoding would at that position.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np
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
        stop: strings and token-id sequences that end the answer (not returned).
        n: answers to generate for the prompt (seeds seed, seed + 1, ... when seeded).
        logprobs: report each generated token's log-probability.
        top_logprobs: and this many most likely alternatives at each position.
        frequency_penalty: subtracted from a token's logit per time it was generated.
        presence_penalty: subtracted once from the logit of a token generated before.
        logit_bias: token id (as a string) -> added to its logit.
        response_format: OpenAI's `json_object` / `json_schema` format, or None (free text):
            the answer is constrained by its grammar (grammar.py), every other token masked.
    """

    max_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list = field(default_factory=list)
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict = field(default_factory=dict)
    response_format: dict | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def adjusts(self) -> bool:
        """Whether the logits are adjusted before choosing (bias or penalties)."""
        return bool(self.logit_bias) or bool(self.frequency_penalty or self.presence_penalty)

    @property
    def needs_host(self) -> bool:
        """Whether a row's next token needs the host first: its logits adjusted (penalties
        count the tokens so far), masked by its grammar (advanced by the tokens so far) or
        its log-probabilities read."""
        return self.adjusts or self.logprobs or self.response_format is not None

    def adjustments(self, generated: Counter) -> dict[int, float]:
        """Token -> what is added to its logit after `generated` (token counts)."""
        out = {int(t): float(b) for t, b in self.logit_bias.items()}
        if self.frequency_penalty or self.presence_penalty:
            for t, c in generated.items():
                out[t] = out.get(t, 0.0) - self.frequency_penalty * c - self.presence_penalty
        return out


def log_target(logits: mx.array, params: GenerationParams) -> mx.array:
    """(..., V) logits -> (..., V) log-probabilities of the target distribution (float32)."""
    logits = logits.astype(mx.float32) / params.temperature
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    vocab = logprobs.shape[-1]
    truncated = 0 < params.top_k < vocab or params.top_p < 1.0
    if not truncated:  # normalized already: a second pass over V per row costs as much
        return logprobs
    if 0 < params.top_k < vocab:
        logprobs = apply_top_k(logprobs, params.top_k)
    if params.top_p < 1.0:
        logprobs = apply_top_p(logprobs, params.top_p)
    return logprobs - mx.logsumexp(logprobs, axis=-1, keepdims=True)


def param_groups(params: list[GenerationParams]) -> list[tuple[GenerationParams, list[int]]]:
    """Rows grouped by their sampling parameters (temperature, top-p, top-k); greedy rows
    are left out. A job usually has one group, so the target transform runs once."""
    groups: dict[tuple, tuple[GenerationParams, list[int]]] = {}
    for i, p in enumerate(params):
        if not p.greedy:
            groups.setdefault((p.temperature, p.top_p, p.top_k), (p, []))[1].append(i)
    return list(groups.values())


def row_seed(params: GenerationParams) -> int:
    """The 32-bit seed of a request: its own, else a fresh random one."""
    if params.seed is None:
        return int.from_bytes(os.urandom(4), "little")
    return params.seed & 0xFFFFFFFF


def position_uniforms(seeds: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """(M,) float32 in [0, 1): the uniform that samples token `positions[m]` of the request
    seeded `seeds[m]` (a counter hash, so it depends on nothing else)."""
    with np.errstate(over="ignore"):
        x = _counter_hash(seeds.astype(np.uint32), positions.astype(np.uint32))
    # 24 bits: exact in float32, and u * 2^32 (the race's seed) is an exact uint32.
    return ((x >> np.uint32(8)).astype(np.float64) * 2.0**-24).astype(np.float32)


def device_uniforms(seeds: mx.array, positions: mx.array) -> mx.array:
    """`position_uniforms` computed on the device, bit for bit (uint32 arithmetic wraps
    alike): for positions the host does not know yet (the resident loop's)."""
    x = _counter_hash(seeds.astype(mx.uint32), positions.astype(mx.uint32))
    return (x >> 8).astype(mx.float32) * (2.0**-24)


def _counter_hash(seeds, positions):
    """The uint32 hash of (seed, position) behind both uniforms (numpy or MLX arrays)."""
    if isinstance(seeds, mx.array):
        golden, k1, k2 = (mx.array(k, mx.uint32) for k in (0x9E3779B9, 0x7FEB352D, 0x846CA68B))
    else:
        golden, k1, k2 = (np.uint32(k) for k in (0x9E3779B9, 0x7FEB352D, 0x846CA68B))

    def lowbias32(x):
        x = x ^ (x >> 16)
        x = x * k1
        x = x ^ (x >> 15)
        x = x * k2
        return x ^ (x >> 16)

    return lowbias32(seeds ^ lowbias32(positions * golden))


def adjust(logits: mx.array, adjustments: list[tuple[int, int, float]]) -> mx.array:
    """(M, V) logits with (row, token, delta) added (bias and penalties)."""
    if not adjustments:
        return logits
    rows, toks, deltas = zip(*adjustments, strict=True)
    add = (
        mx.zeros(logits.shape, mx.float32)
        .at[mx.array(rows), mx.array(toks)]
        .add(mx.array(deltas, mx.float32))
    )
    return logits.astype(mx.float32) + add


def token_logprobs(
    logits: mx.array, params: list[GenerationParams], chosen: mx.array, k: int
) -> tuple[mx.array, mx.array, mx.array]:
    """Log-probabilities of `chosen` (M,) under each row's distribution (the adjusted
    logits; temperature, top-k and top-p applied for sampled rows), and the `k` most likely
    tokens with theirs: ((M,), (M, k) ids, (M, k) log-probabilities)."""
    lp = logits.astype(mx.float32)
    lp = lp - mx.logsumexp(lp, axis=-1, keepdims=True)
    for p, idx in param_groups(params):
        rows = mx.array(idx)
        lp[rows] = log_target(logits[rows], p)
    picked = mx.take_along_axis(lp, chosen[:, None].astype(mx.int32), axis=-1)[:, 0]
    if k <= 0:
        empty = mx.zeros((lp.shape[0], 0))
        return picked, empty.astype(mx.int32), empty
    top = mx.argsort(-lp, axis=-1)[:, :k]
    return picked, top, mx.take_along_axis(lp, top, axis=-1)


def choose(
    logits: mx.array,
    params: list[GenerationParams],
    seeds: np.ndarray,
    positions: np.ndarray | mx.array,
) -> mx.array:
    """(M, V) logits -> (M,) the token each row's target distribution puts at `positions`
    (host positions, or device ones: `device_uniforms`).

    Greedy rows take the argmax. Sampled rows draw from their target distribution by an
    exponential race seeded by (request seed, position) (`kernels.verify.choose`): the token
    at position t is a function of the request's seed, its prefix and t alone, so plain
    decoding, every drafter and every batch produce the same sample, and a draft token is
    accepted exactly when it equals it (probability p(x), as in speculative sampling with a
    deterministic drafter). A draft model sampling with the same uniforms agrees with the
    target more often than with independent randomness.
    """
    from kernels.verify import choose as kernel_choose

    out = mx.argmax(logits, axis=-1).astype(mx.int32)
    groups = param_groups(params)
    for p, idx in groups:
        if isinstance(positions, mx.array):
            u = device_uniforms(mx.array(seeds[idx]), positions[mx.array(idx)])
        else:
            u = mx.array(position_uniforms(seeds[idx], positions[idx]))
        rows = mx.array(idx) if len(idx) < len(params) else None
        lp = log_target(logits if rows is None else logits[rows], p)
        drawn = kernel_choose(lp[None], u[None])[0]
        if rows is None:
            return drawn
        out[rows] = drawn
    return out
