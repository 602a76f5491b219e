"""exp, softmax and SwiGLU from plain arithmetic, for MLX's CPU backend.

On x86 Linux MLX's CPU backend evaluates `exp` (and with it `sigmoid`, `silu` and the
softmax inside `scaled_dot_product_attention`) one element at a time through libm, while
a multiply runs vectorised. A decode step evaluates it rows x 1536 x 30 times in the
SwiGLU of every MLP and rows x heads x keys x 30 times in the attention softmax: with
these functions a 64-row job ran 45 -> 65 tok/s here (`bench/cpu_math_ab.py`).

Here exp is 2^n * 2^f with n = round(x * log2 e), |f| <= 1/2, and 2^f by its degree-7
Taylor polynomial: multiplies, adds and one exponent-field shift, all of which MLX runs as
vectorised loops. Its relative error is below 2e-7 (float32's epsilon is 1.2e-7). It is
used for float32 on the CPU only; other dtypes and devices keep MLX's own functions.
"""

from __future__ import annotations

import math
from functools import partial

import mlx.core as mx
import mlx.nn as nn

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
# (ln 2)^k / k!, k = 1..7: 2^f = e^(f ln 2) for |f| <= 1/2
_C = [_LN2**k / math.factorial(k) for k in range(1, 8)]


@partial(mx.compile, shapeless=True)
def _exp_parts(x: mx.array) -> tuple[mx.array, mx.array]:
    """2^f and the bits of the float32 2^n, e^x = 2^f * 2^n (compiled: one fused loop)."""
    t = mx.clip(x * _LOG2E, -100.0, 100.0)
    n = mx.round(t)
    f = t - n
    p = _C[6]
    for c in reversed(_C[:6]):
        p = p * f + c
    p = p * f + 1.0
    return p, mx.left_shift(n.astype(mx.int32) + 127, 23)


def exp(x: mx.array) -> mx.array:
    """e^x for float32 x with |x| <= 69.3; beyond, e^(+-69.3) = 2^(+-100). (Clipped so no
    result and no product of one is subnormal: x86 computes subnormals ~100x slower. The
    bit view cannot be compiled shapeless, so it stays outside the fused loop.)"""
    p, bits = _exp_parts(x)
    return p * bits.view(mx.float32)


@partial(mx.compile, shapeless=True)
def _shifted(scores: mx.array, keep: mx.array) -> mx.array:
    s = scores + (keep - 1.0) * 1e30
    return s - s.max(axis=-1, keepdims=True)


@partial(mx.compile, shapeless=True)
def _normalised(e: mx.array, keep: mx.array) -> mx.array:
    e = e * keep
    return e / e.sum(axis=-1, keepdims=True)


def softmax(scores: mx.array, keep: mx.array) -> mx.array:
    """softmax over the last axis of the keys `keep` marks (1.0; 0.0 = masked, weight 0)."""
    if scores.shape[-1] == 1:
        # One key (a feature head's first pair): its weight is its mask. The functions
        # below are compiled shapeless from calls with several keys, and MLX's shapeless
        # graphs do not survive the reduction axis shrinking to 1 (a crash, seen here).
        return mx.broadcast_to(keep, scores.shape)
    return _normalised(exp(_shifted(scores, keep)), keep)


@partial(mx.compile, shapeless=True)
def _gated(gate: mx.array, x: mx.array, e: mx.array) -> mx.array:
    return gate * x / (1.0 + e)


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x (mlx-lm's `swiglu`)."""
    return _gated(gate, x, exp(-gate))


def applies(x: mx.array) -> bool:
    """Whether these functions replace MLX's for `x` (float32 on the CPU)."""
    return x.dtype == mx.float32 and mx.default_device() == mx.cpu


SCORE_BYTES = 8 * 2**20  # the scores of one block of queries, at most (a long prompt chunk's)


def attention(q: mx.array, k: mx.array, v: mx.array, scale: float, keep: mx.array) -> mx.array:
    """Grouped-query attention, as `mx.fast.scaled_dot_product_attention` with a mask.

    q: (R, H, W, D) queries; k, v: (R, KV, S, D) with H a multiple of KV (query head h
    reads key head h // (H / KV), as mlx-lm's models do); keep: (R, 1, W, S) float32, 1.0
    where a query sees a key, 0.0 where it does not (`keep_mask`). Returns (R, H, W, D).

    Queries run in blocks whose scores (R, H, block, S) stay under `SCORE_BYTES`: a long
    prompt chunk over a long context never holds its whole (W x S x H) score tensor, nor
    the softmax's temporaries of it. Each query's row of scores is computed whole, so the
    blocks give the same result as one pass.
    """
    R, H, W, D = q.shape
    block = max(1, SCORE_BYTES // (4 * R * H * k.shape[2]))
    if W <= block:
        return _attention(q, k, v, scale, keep)
    outs = []
    for i in range(0, W, block):
        outs.append(_attention(q[:, :, i : i + block], k, v, scale, keep[:, :, i : i + block]))
        # Computed block by block: queued lazily, every block's scores would be alive at
        # once. (The CPU backend computes a graph as it is evaluated: no overlap is lost.)
        mx.eval(outs[-1])
    return mx.concatenate(outs, axis=2)


def _attention(q: mx.array, k: mx.array, v: mx.array, scale: float, keep: mx.array) -> mx.array:
    R, H, W, D = q.shape
    kv = k.shape[1]
    g = H // kv
    qg = (q * scale).reshape(R, kv, g * W, D)
    s = (qg @ k.swapaxes(-1, -2)).reshape(R, kv, g, W, -1)  # (R, KV, G, W, S)
    p = softmax(s, keep[:, :, None])
    o = p.reshape(R, kv, g * W, -1) @ v  # (R, KV, G * W, D)
    return o.reshape(R, H, W, D)


def keep_mask(mask: mx.array) -> mx.array:
    """A boolean mask (True = visible) as the 1.0/0.0 mask `attention` takes."""
    return mask.astype(mx.float32)


def mlp(module: nn.Module, x: mx.array) -> mx.array:
    """A llama-family MLP (gate, up, down projections and SwiGLU) with `swiglu` above."""
    return module.down_proj(swiglu(module.gate_proj(x), module.up_proj(x)))


def is_swiglu_mlp(module: nn.Module) -> bool:
    """mlx-lm's llama/qwen2/qwen3/mistral MLP: down(swiglu(gate(x), up(x)))."""
    return type(module).__name__ == "MLP" and type(module).__module__ in _SWIGLU_MODULES


_SWIGLU_MODULES = {f"mlx_lm.models.{m}" for m in ("llama", "qwen2", "qwen3")}
