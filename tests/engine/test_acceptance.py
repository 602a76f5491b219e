"""The acceptance routine on hand-made logits: greedy tables and sampled distributions."""

import mlx.core as mx
import numpy as np
import pytest

from core.engine.acceptance import accept_greedy, accept_sampled
from core.engine.sampling import GenerationParams, KeyStream, log_target


def onehot_logits(rows, V=6):
    """(B, K+1, V) logits whose argmax per position is given by rows."""
    x = np.full((len(rows), len(rows[0]), V), -5.0, np.float32)
    for b, r in enumerate(rows):
        for i, t in enumerate(r):
            x[b, i, t] = 5.0
    return mx.array(x)


@pytest.mark.parametrize(
    "argmax, draft, n, nxt",
    [
        ([1, 2, 3, 4], [1, 2, 3], 3, 4),  # full acceptance, bonus token
        ([1, 2, 3, 4], [5, 2, 3], 0, 1),  # first token rejected: the target's own choice
        ([1, 2, 3, 4], [1, 5, 3], 1, 2),  # stops at the first mismatch, later matches ignored
        ([1, 2, 3, 4], [1, 2, 0], 2, 3),
        ([3], [], 0, 3),  # no draft: a plain step
    ],
)
def test_greedy_table(argmax, draft, n, nxt):
    logits = onehot_logits([argmax])
    tokens = mx.array([draft], mx.int32).reshape(1, len(draft))
    got_n, got_next = accept_greedy(logits, tokens)
    assert got_n.tolist() == [n]
    assert got_next.tolist() == [nxt]


def test_greedy_rows_accept_independently():
    logits = onehot_logits([[1, 2, 3], [1, 2, 3], [4, 4, 4]])
    tokens = mx.array([[1, 2], [1, 0], [1, 2]], mx.int32)
    n, nxt = accept_greedy(logits, tokens)
    assert n.tolist() == [2, 1, 0]
    assert nxt.tolist() == [3, 2, 4]


def chi_square_ok(counts, probs, n, alpha_z=5.0):
    """Pearson chi-square against expected counts; the bound is mean + 5 std of the
    chi-square distribution with dof = bins - 1 (false-alarm rate < 1e-5)."""
    keep = probs * n >= 5
    obs, exp = counts[keep], probs[keep] * n
    # lump rare bins together so every bin has an expected count >= 5
    obs = np.append(obs, counts[~keep].sum())
    exp = np.append(exp, probs[~keep].sum() * n)
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = len(obs) - 1
    return stat, dof + alpha_z * np.sqrt(2 * dof)


@pytest.mark.parametrize("with_q", [False, True])
def test_sampled_first_token_matches_target(with_q):
    """Many rows of one problem: the first emitted token is distributed exactly as p[0]."""
    V, K, B = 8, 3, 20000
    rng = np.random.default_rng(0)
    p_logits = rng.normal(size=(1, K + 1, V)).astype(np.float32) * 1.5
    logp = log_target(mx.array(p_logits), GenerationParams(temperature=1.0))
    logp = mx.broadcast_to(logp, (B, K + 1, V))
    keys = KeyStream(123)
    if with_q:
        q = rng.dirichlet(np.ones(V), size=(K,)).astype(np.float32)  # (K, V)
        toks = np.stack([rng.choice(V, size=B, p=q[i] / q[i].sum()) for i in range(K)], 1)
        draft_probs = mx.broadcast_to(mx.array(q)[None], (B, K, V))
    else:
        toks = np.tile(np.array([[2, 5, 1]]), (B, 1))  # a fixed deterministic draft
        draft_probs = None
    tokens = mx.array(toks.astype(np.int32))
    n, nxt = accept_sampled(logp, tokens, draft_probs, keys)
    n, nxt = np.array(n), np.array(nxt)
    first = np.where(n > 0, toks[:, 0], nxt)
    counts = np.bincount(first, minlength=V).astype(float)
    p0 = np.exp(np.array(logp[0, 0]))
    stat, bound = chi_square_ok(counts, p0, B)
    assert stat < bound, (stat, bound, counts / B, p0)
    # and the second token, given a first-token acceptance, follows p[1]
    second = np.where(n > 1, toks[:, 1], nxt)[n >= 1]
    counts2 = np.bincount(second, minlength=V).astype(float)
    p1 = np.exp(np.array(logp[0, 1]))
    stat2, bound2 = chi_square_ok(counts2, p1, len(second))
    assert stat2 < bound2, (stat2, bound2)


def test_sampled_rejects_tokens_outside_top_k():
    """A draft token the target's top-k removed is never accepted."""
    V = 6
    logits = mx.array(np.array([[[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]]], np.float32))
    params = GenerationParams(temperature=1.0, top_k=2)
    logp = mx.broadcast_to(log_target(logits, params), (500, 2, V))
    tokens = mx.zeros((500, 1), mx.int32)  # token 0 is outside the top 2
    n, nxt = accept_sampled(logp, tokens, None, KeyStream(0))
    assert np.array(n).max() == 0
    assert set(np.array(nxt).tolist()) <= {4, 5}
