"""The one acceptance routine for chains: target logits + draft -> how many to keep + next token.

Greedy keeps draft tokens while they equal the target's argmax, so the output is exactly
plain greedy decoding. Sampling is speculative sampling (Leviathan et al., Chen et al.):
accept draft token x with probability min(1, p(x) / q(x)); at the first rejection sample
from normalize(max(0, p - q)); after full acceptance sample the bonus token from p. With
`q` one-hot (deterministic drafters) the rule becomes: accept with probability p(x). Both
are batched over rows: each row may accept a different number of tokens.
"""

from __future__ import annotations

import mlx.core as mx

from .sampling import GenerationParams, KeyStream, log_target


def accept_greedy(logits: mx.array, tokens: mx.array) -> tuple[mx.array, mx.array]:
    """Greedy acceptance.

    Args:
        logits: (B, K + 1, V) target logits at [last committed token, draft tokens...].
        tokens: (B, K) draft tokens.

    Returns:
        num_accepted (B,) and next_token (B,): the target's argmax after the accepted prefix.
    """
    choice = mx.argmax(logits, axis=-1)  # (B, K + 1)
    k = tokens.shape[1]
    match = (choice[:, :k] == tokens).astype(mx.int32)  # (B, K)
    n = mx.cumprod(match, axis=1).sum(axis=1) if k else mx.zeros(choice.shape[:1], mx.int32)
    nxt = mx.take_along_axis(choice, n[:, None], axis=1)[:, 0]
    return n, nxt


def accept_sampled(
    logp: mx.array,
    tokens: mx.array,
    draft_probs: mx.array | None,
    keys: KeyStream,
) -> tuple[mx.array, mx.array]:
    """Speculative-sampling acceptance.

    Args:
        logp: (B, K + 1, V) target log-probabilities (temperature, top-k, top-p applied).
        tokens: (B, K) draft tokens.
        draft_probs: (B, K, V) the distribution each draft token was sampled from, or None
            for deterministic drafters (one-hot on `tokens`).
        keys: the request's key stream.

    Returns:
        num_accepted (B,) and next_token (B,), together distributed exactly as sampling the
        target token by token.
    """
    B, K1, V = logp.shape
    k = K1 - 1
    p = mx.exp(logp)  # (B, K + 1, V)
    # q padded with a zero row at position K: after full acceptance the residual is p itself.
    if draft_probs is None:
        padded = mx.concatenate([tokens, mx.full((B, 1), -1, tokens.dtype)], axis=1)
        q = (padded[..., None] == mx.arange(V)).astype(p.dtype)  # (B, K + 1, V)
    else:
        q = mx.concatenate([draft_probs.astype(p.dtype), mx.zeros((B, 1, V), p.dtype)], axis=1)
    if k:
        idx = tokens[..., None]
        p_tok = mx.take_along_axis(p[:, :k], idx, axis=-1)[..., 0]  # (B, K)
        q_tok = mx.take_along_axis(q[:, :k], idx, axis=-1)[..., 0]  # (B, K)
        u = mx.random.uniform(shape=(B, k), key=keys.next())
        accepted = (u * q_tok < p_tok).astype(mx.int32)  # u < p/q, q > 0 where sampled
        n = mx.cumprod(accepted, axis=1).sum(axis=1)  # (B,)
    else:
        n = mx.zeros((B,), mx.int32)
    sel = n[:, None, None]
    p_n = mx.take_along_axis(p, sel, axis=1)[:, 0]  # (B, V)
    q_n = mx.take_along_axis(q, sel, axis=1)[:, 0]  # (B, V)
    resid = mx.maximum(p_n - q_n, 0.0)
    mass = resid.sum(axis=-1, keepdims=True)
    resid = mx.where(mass > 0, resid / mx.maximum(mass, 1e-30), p_n)
    nxt = mx.random.categorical(mx.log(resid), key=keys.next())
    return n, nxt


def accept(
    logits: mx.array,
    tokens: mx.array,
    draft_probs: mx.array | None,
    params: GenerationParams,
    keys: KeyStream,
) -> tuple[mx.array, mx.array]:
    """Dispatch on the request's parameters: greedy or speculative sampling."""
    if params.greedy:
        return accept_greedy(logits, tokens)
    return accept_sampled(log_target(logits, params), tokens, draft_probs, keys)
