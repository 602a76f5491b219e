"""Reference semantics of tree verification (kernels.verify.verify_ops)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from kernels.tree import children_table
from kernels.verify import verify, verify_ops
from tests.kernels.helpers import chi2_critical, chi2_stat

NEG = -1e9


def _greedy_logits(argmaxes: list[int], V: int = 10) -> mx.array:
    """(1, N, V) logits whose argmax at node i is argmaxes[i]."""
    lg = np.full((1, len(argmaxes), V), 0.0, dtype=np.float32)
    for i, a in enumerate(argmaxes):
        lg[0, i, a] = 5.0
    return mx.array(lg)


def _run(argmaxes, tokens, parents):
    r = verify_ops(_greedy_logits(argmaxes), mx.array([tokens]), parents, None, None, True)
    return r.path[0].tolist(), int(r.num_accepted[0]), int(r.next_token[0]), r


# -- greedy tables -------------------------------------------------------------------------


def test_greedy_chain_full_accept_gives_bonus():
    path, n, nxt, r = _run([3, 4, 5, 6], [9, 3, 4, 5], [-1, 0, 1, 2])
    assert (path, n, nxt) == ([0, 1, 2, 3], 3, 6)
    assert r.accepted[0].tolist() == [True, True, True, True]


def test_greedy_chain_first_reject_gives_correction():
    path, n, nxt, _ = _run([3, 7, 5, 6], [9, 3, 4, 5], [-1, 0, 1, 2])
    assert (path, n, nxt) == ([0, 1, -1, -1], 1, 7)


def test_greedy_root_reject():
    path, n, nxt, r = _run([8, 4, 5, 6], [9, 3, 4, 5], [-1, 0, 1, 2])
    assert (path, n, nxt) == ([0, -1, -1, -1], 0, 8)
    assert r.accepted[0].tolist() == [True, False, False, False]


def test_greedy_picks_the_matching_sibling():
    # root -> 1 (tok 3), 2 (tok 4); 1 -> 3 (tok 1); 2 -> 4 (tok 2), 5 (tok 6)
    parents = [-1, 0, 0, 1, 2, 2]
    tokens = [9, 3, 4, 1, 2, 6]
    path, n, nxt, r = _run([4, 1, 6, 0, 0, 7], tokens, parents)
    assert (path[:3], n, nxt) == ([0, 2, 5], 2, 7)
    assert r.child[0].tolist() == [2, 3, 5, -1, -1, -1]


def test_greedy_duplicate_siblings_take_the_first():
    path, n, nxt, _ = _run([3, 1, 2], [9, 3, 3], [-1, 0, 0])
    assert (path, n, nxt) == ([0, 1, -1], 1, 1)


def test_greedy_rows_are_independent():
    lg = mx.concatenate([_greedy_logits([3, 4, 5]), _greedy_logits([3, 8, 5])], axis=0)
    r = verify_ops(lg, mx.array([[0, 3, 4], [0, 3, 4]]), [-1, 0, 1], None, None, True)
    assert r.num_accepted.tolist() == [2, 1]
    assert r.next_token.tolist() == [5, 8]


def test_root_only_tree_returns_argmax():
    r = verify_ops(_greedy_logits([6]), mx.array([[1]]), [-1], None, None, True)
    assert r.num_accepted.tolist() == [0] and r.next_token.tolist() == [6]


def test_sampling_with_one_hot_target_is_greedy():
    # A one-hot target accepts exactly the argmax token, whatever the uniforms.
    argmaxes = [3, 4, 5, 6]
    lg = np.full((64, 4, 10), NEG, dtype=np.float32)
    for i, a in enumerate(argmaxes):
        lg[:, i, a] = 0.0
    tokens = mx.array([[9, 3, 4, 7]] * 64)
    u = mx.random.uniform(shape=(64, 4, 2), key=mx.random.key(0))
    r = verify_ops(mx.array(lg), tokens, [-1, 0, 1, 2], None, u, False)
    assert r.num_accepted.tolist() == [2] * 64
    assert r.next_token.tolist() == [5] * 64


def test_bad_parents_are_rejected():
    with pytest.raises(ValueError, match="parents\\[0\\]"):
        children_table([0, 0])
    with pytest.raises(ValueError, match="parents\\[2\\]"):
        children_table([-1, 0, 2])


def test_dispatcher_uses_reference_on_cpu():
    lg = _greedy_logits([3, 4])
    with mx.stream(mx.cpu):
        r = verify(lg, mx.array([[0, 3]]), [-1, 0])
    assert r.next_token.tolist() == [4]
    with pytest.raises(ValueError, match="unknown verify backend"):
        verify(lg, mx.array([[0, 3]]), [-1, 0], backend="vulkan")


# -- sampling converges to the target ------------------------------------------------------

V = 6
P0 = np.array([0.30, 0.25, 0.20, 0.15, 0.10, 0.0])  # target after the root
# Target after a node whose token is x: row x (depends on the node's token, like a model).
PN = np.array(
    [
        [0.05, 0.50, 0.05, 0.30, 0.10, 0.0],
        [0.40, 0.10, 0.10, 0.10, 0.10, 0.2],
        [0.10, 0.20, 0.30, 0.20, 0.20, 0.0],
        [0.60, 0.10, 0.10, 0.10, 0.05, 0.05],
        [0.20, 0.20, 0.20, 0.20, 0.10, 0.1],
        [1 / 6] * 6,
    ]
)
Q0 = np.array([0.10, 0.10, 0.40, 0.10, 0.10, 0.20])  # a draft that disagrees with P0
QN = np.array([[0.4, 0.1, 0.1, 0.2, 0.1, 0.1]] * V)
ROWS = 40000
# root -> 1, 2, 3 ; 1 -> 4, 5 ; 2 -> 6
PARENTS = [-1, 0, 0, 0, 1, 1, 2]


def _log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(p > 0, np.log(np.maximum(p, 1e-30)), -np.inf).astype(np.float32)


def _target_logits(tokens: np.ndarray) -> mx.array:
    lg = _log(PN)[tokens]  # (B, N, V)
    lg[:, 0] = _log(P0)
    return mx.array(lg)


def _draw_tokens(rng, mode: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Node tokens (B, N) and the draft distribution each was drawn from (B, N, V)."""
    N = len(PARENTS)
    tokens = np.zeros((ROWS, N), dtype=np.int32)
    if mode == "deterministic":
        tokens[:] = [0, 0, 2, 2, 1, 3, 4]  # includes a duplicate sibling (2, 2)
        return tokens, None
    probs = np.zeros((ROWS, N, V), dtype=np.float32)
    rows = np.arange(ROWS)
    table = children_table(PARENTS)
    for c in range(N):
        q = np.tile(Q0, (ROWS, 1)) if c == 0 else QN[tokens[:, c]].copy()
        for j in (int(j) for j in table[c] if j >= 0):
            qn = q / q.sum(axis=1, keepdims=True)
            x = (rng.random(ROWS)[:, None] > np.cumsum(qn, axis=1)).sum(axis=1).clip(0, V - 1)
            tokens[:, j] = x
            probs[:, j] = qn
            if mode == "without_replacement":
                q[rows, x] = 0.0
    return tokens, probs


def _emitted(r, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First emitted token, the node it came from (-1 = not a node) and the second token."""
    path = np.array(r.path)
    num = np.array(r.num_accepted)
    nxt = np.array(r.next_token)
    rows = np.arange(tokens.shape[0])
    first_node = np.where(num >= 1, path[:, 1], -1)
    first = np.where(num >= 1, tokens[rows, np.maximum(path[:, 1], 0)], nxt)
    second = np.where(num >= 2, tokens[rows, np.maximum(path[:, 2], 0)], nxt)
    return first, first_node, second


def _assert_matches(samples: np.ndarray, probs: np.ndarray, what: str) -> None:
    counts = np.bincount(samples, minlength=V)
    assert counts[probs == 0].sum() == 0, f"{what}: zero-probability tokens were emitted"
    stat, df = chi2_stat(counts, probs)
    bound = chi2_critical(df)
    assert stat < bound, f"{what}: chi2 {stat:.1f} >= {bound:.1f} (df {df}), counts {counts}"


@pytest.mark.parametrize("mode", ["deterministic", "iid", "without_replacement"])
@pytest.mark.slow
def test_sampling_matches_target_distribution(mode):
    """Emitted tokens follow the target: the first ~ P0, the next after node x ~ PN[x].

    40000 rows of one 7-node tree (3 root siblings, 2 grandchildren); Pearson chi-square at
    the one-sided 1e-4 level (Wilson-Hilferty); zero-mass tokens must never appear."""
    rng = np.random.default_rng(7)
    tokens, probs = _draw_tokens(rng, mode)
    u = mx.array(rng.random((ROWS, len(PARENTS), 2)).astype(np.float32))
    r = verify_ops(
        _target_logits(tokens),
        mx.array(tokens),
        PARENTS,
        None if probs is None else mx.array(probs),
        u,
        False,
    )
    first, first_node, second = _emitted(r, tokens)
    _assert_matches(first, P0, "first token")
    accepted_rows = first_node >= 0
    assert accepted_rows.mean() > 0.2  # the test exercises the accept path
    for x in range(V):
        rows = accepted_rows & (first == x)
        if rows.sum() > 500:
            _assert_matches(second[rows], PN[x], f"second token after {x}")


def test_sampling_is_seeded():
    rng = np.random.default_rng(1)
    tokens, _ = _draw_tokens(rng, "deterministic")
    tokens = tokens[:256]
    lg = _target_logits(tokens)
    u = mx.random.uniform(shape=(256, len(PARENTS), 2), key=mx.random.key(3))
    a = verify_ops(lg, mx.array(tokens), PARENTS, None, u, False)
    b = verify_ops(lg, mx.array(tokens), PARENTS, None, u, False)
    assert a.next_token.tolist() == b.next_token.tolist()
    assert a.path.tolist() == b.path.tolist()


def test_bonus_token_at_a_leaf_follows_the_target():
    """A root-only tree: the exponential race alone must sample P0 (chi-square, 1e-4)."""
    u = mx.random.uniform(shape=(ROWS, 1, 2), key=mx.random.key(11))
    lg = mx.broadcast_to(mx.array(_log(P0))[None, None], (ROWS, 1, V))
    r = verify_ops(lg, mx.zeros((ROWS, 1), mx.int32), [-1], None, u, False)
    assert r.num_accepted.tolist() == [0] * ROWS
    _assert_matches(np.array(r.next_token), P0, "bonus token")


def test_per_row_parents_verify_each_row_as_its_own_tree():
    """(B, N) parents with padded tails: row b's result equals verifying it alone."""
    import numpy as np

    from kernels.tree import PAD

    rng = np.random.default_rng(7)
    V, N = 11, 6
    rows = [[-1, 0, 0, 1], [-1], [-1, 0, 1, 2, 3, 4]]
    parents = np.full((3, N), PAD, dtype=np.int32)
    for b, p in enumerate(rows):
        parents[b, : len(p)] = p
    logits = mx.array(rng.normal(size=(3, N, V)).astype(np.float32))
    am = np.asarray(mx.argmax(logits, axis=-1))
    tokens = np.zeros((3, N), np.int32)
    for b, p in enumerate(rows):
        for j in range(1, len(p)):
            tokens[b, j] = am[b, p[j]]  # every node is the target's choice: all accepted
    together = verify(logits, mx.array(tokens), parents, greedy=True)
    for b, p in enumerate(rows):
        n = len(p)
        alone = verify(logits[b : b + 1, :n], mx.array(tokens[b : b + 1, :n]), p, greedy=True)
        assert together.num_accepted[b].item() == alone.num_accepted[0].item()
        assert together.next_token[b].item() == alone.next_token[0].item()
    assert together.num_accepted.tolist() == [2, 0, 5]  # the deepest path of each row


def test_padding_must_come_last():
    from kernels.tree import PAD, check_parents

    with pytest.raises(ValueError, match="before it"):
        check_parents([[-1, PAD, 0]])
