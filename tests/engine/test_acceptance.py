"""The acceptance rule on hand-made choices (the walk), and the target's own token choice
(greedy argmax, seeded sampling by position) on hand-made logits."""

import mlx.core as mx
import numpy as np
import pytest

from core.engine.acceptance import walk
from core.engine.sampling import (
    GenerationParams,
    choose,
    device_uniforms,
    log_target,
    position_uniforms,
)


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


@pytest.mark.parametrize(
    "tokens, choice, path, nxt",
    [
        ([5, 6, 7], [5, 6, 7, 8], [0, 1, 2], 8),  # all accepted + bonus
        ([5, 6, 7], [5, 9, 7, 8], [0], 9),  # second rejected: the target's token instead
        ([5, 6, 7], [4, 6, 7, 8], [], 4),  # first rejected
        ([], [3], [], 3),  # no draft: a plain step
    ],
)
def test_chain_walk(tokens, choice, path, nxt):
    assert walk(tokens, None, choice) == (path, nxt)


def test_tree_walk_follows_the_matching_child():
    #            root
    #          /   |   \
    #        0:5  1:6  2:7
    #        |          |
    #       3:8        4:9
    tokens, parents = [5, 6, 7, 8, 9], [-1, -1, -1, 0, 2]
    # the target wants 7 after the root, then 9 after node 2, then 1 after node 4
    choice = [7, 0, 0, 9, 0, 1]  # per node: root, then nodes 0..4
    assert walk(tokens, parents, choice) == ([2, 4], 1)
    # wants 5 then something else than 8: one node
    assert walk(tokens, parents, [5, 2, 0, 0, 0, 0]) == ([0], 2)
    # wants a token no child has
    assert walk(tokens, parents, [3, 0, 0, 0, 0, 0]) == ([], 3)


def test_greedy_choice_is_the_argmax():
    logits = mx.array(np.random.default_rng(0).normal(size=(7, 50)).astype(np.float32))
    got = choose(logits, [GenerationParams()] * 7, np.zeros(7, np.uint32), np.arange(7))
    assert got.tolist() == mx.argmax(logits, axis=-1).tolist()


def test_a_sampled_choice_depends_on_seed_and_position_only():
    logits = mx.array(np.random.default_rng(1).normal(size=(1, 30)).astype(np.float32))
    p = GenerationParams(temperature=1.0)
    one = lambda seed, pos: choose(logits, [p], np.array([seed], np.uint32), np.array([pos])).item()  # noqa: E731
    assert one(3, 10) == one(3, 10)
    assert len({one(3, pos) for pos in range(40)}) > 5  # positions draw afresh
    # in a batch beside other rows, with other parameters, the row draws the same token
    batch = mx.concatenate([logits, logits * 2, logits])
    params = [p, GenerationParams(), GenerationParams(temperature=0.5, top_k=3)]
    got = choose(batch, params, np.array([3, 3, 9], np.uint32), np.array([10, 10, 10]))
    assert got[0].item() == one(3, 10)


@pytest.mark.parametrize(
    "params",
    [
        GenerationParams(temperature=1.0),
        GenerationParams(temperature=0.7, top_k=4),
        GenerationParams(temperature=1.3, top_p=0.8),
    ],
)
def test_sampled_choices_follow_the_target_distribution(params):
    """20,000 positions of one seed: the chosen tokens are distributed as the target
    (temperature, top-k and top-p applied), chi-square."""
    V, n = 12, 20000
    logits = mx.array(np.random.default_rng(2).normal(size=(1, V)).astype(np.float32) * 1.5)
    target = np.exp(np.array(log_target(logits, params)))[0]
    rows = mx.broadcast_to(logits, (n, V))
    got = choose(rows, [params] * n, np.full(n, 12345, np.uint32), np.arange(n)).tolist()
    counts = np.bincount(got, minlength=V)
    assert counts[target == 0].sum() == 0  # filtered tokens are never drawn
    stat, bound = chi_square_ok(counts.astype(float), target, n)
    assert stat < bound, (stat, bound)


def test_device_uniforms_are_the_hosts_bit_for_bit():
    rng = np.random.default_rng(0)
    seeds = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    pos = rng.integers(0, 1 << 20, 20000)
    got = np.array(device_uniforms(mx.array(seeds), mx.array(pos.astype(np.int32))))
    assert np.array_equal(got, position_uniforms(seeds, pos))


def test_position_uniforms_are_uniform_and_24_bit():
    u = position_uniforms(np.full(50000, 7, np.uint32), np.arange(50000))
    assert u.min() >= 0.0 and u.max() < 1.0
    assert np.all((u * 2**24) == np.floor(u * 2**24))  # exact in float32, u * 2^32 an integer
    counts = np.histogram(u, 10, range=(0, 1))[0].astype(float)
    stat, bound = chi_square_ok(counts, np.full(10, 0.1), 50000)
    assert stat < bound
