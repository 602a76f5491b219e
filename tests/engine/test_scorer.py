"""The batched scorer and the per-row cache: the logits of every row equal the model's own
forward on that row's text alone; rollback and tree compaction leave each row's cache
equal to a fresh prefill of the text it kept; padded reads change nothing."""

import mlx.core as mx
import numpy as np
import pytest

from core.engine.cache import BatchKVCache
from core.engine.scorer import Segment, forward

PROMPTS = [[5, 6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16, 17, 18, 19, 20]]


def _model(make_tiny, seed=0):
    return make_tiny(seed).model


def _prefill(model, pad=0, capacity=4, rows=(0, 2, 3)):
    cache = BatchKVCache(len(model.model.layers), capacity, pad=pad)
    forward(model, cache, [Segment(list(rows), PROMPTS, logits="none")])
    for r, p in zip(rows, PROMPTS, strict=True):
        cache.lengths[r] = len(p)
    return cache


# CUDA's float32 matmuls round per shape at ~5e-4 relative (packed rows against one row
# alone: seen on the H200); the CPU's agree to 1e-4.
TOL = 1e-4 if mx.default_device() == mx.cpu else 3e-3


def _close(a, b):
    return mx.allclose(a, b, atol=TOL, rtol=TOL).item()


@pytest.mark.parametrize("pad", [0, 8])
def test_ragged_prefill_and_decode_equal_each_row_alone(make_tiny, pad):
    model = _model(make_tiny)
    cache = BatchKVCache(len(model.model.layers), 4, pad=pad)
    out = forward(model, cache, [Segment([0, 2, 3], PROMPTS)])[0]
    off = 0
    for p in PROMPTS:
        assert _close(out[off : off + len(p)], model(mx.array([p]))[0])
        off += len(p)
    for r, p in zip([0, 2, 3], PROMPTS, strict=True):
        cache.lengths[r] = len(p)
    drafts = [[1, 2, 3], [4], [7, 8]]
    out = forward(model, cache, [Segment([0, 2, 3], drafts)])[0]
    off = 0
    for p, d in zip(PROMPTS, drafts, strict=True):
        assert _close(out[off : off + len(d)], model(mx.array([p + d]))[0, len(p) :])
        off += len(d)


def test_tree_nodes_see_their_ancestors_only(make_tiny):
    model = _model(make_tiny, 1)
    cache = _prefill(model)
    # row 2 (prompt [10, 11]): root 4 with children 5 and 6; 6 has a child 7
    out = forward(model, cache, [Segment([2], [[4, 5, 6, 7]], parents=[[-1, 0, 0, 2]])])[0]
    for node, path in [(0, [4]), (1, [4, 5]), (2, [4, 6]), (3, [4, 6, 7])]:
        assert _close(out[node], model(mx.array([PROMPTS[1] + path]))[0, -1])


def test_early_exit_hidden_states_resume_at_their_layer(make_tiny):
    model = _model(make_tiny, 2)
    cache = _prefill(model)
    hidden = forward(model, cache, [Segment([0], [[1, 2]])], stop=2)[0]
    out = forward(
        model,
        cache,
        [Segment([0], [[1, 2]], hidden=hidden, start_layer=2), Segment([3], [[7, 8]])],
    )
    assert _close(out[0], model(mx.array([PROMPTS[0] + [1, 2]]))[0, -2:])
    assert _close(out[1], model(mx.array([PROMPTS[2] + [7, 8]]))[0, -2:])


def _row_kv(cache, row):
    n = int(cache.lengths[row])
    return [(k[row, :, :n], v[row, :, :n]) for k, v in zip(cache.keys, cache.values, strict=True)]


def _same_kv(a, b):
    return all(_close(ka, kb) and _close(va, vb) for (ka, va), (kb, vb) in zip(a, b, strict=True))


def test_per_row_rollback_equals_a_fresh_prefill(make_tiny):
    model = _model(make_tiny, 3)
    cache = _prefill(model)
    forward(model, cache, [Segment([0, 2, 3], [[1, 2, 3, 4], [5, 6], [7]])])
    kept = {0: 2, 2: 0, 3: 1}  # each row keeps a different number of its new tokens
    for r, n in kept.items():
        cache.lengths[r] += n
    fresh = BatchKVCache(len(model.model.layers), 4, pad=0)
    texts = [PROMPTS[0] + [1, 2], PROMPTS[1], PROMPTS[2] + [7]]
    forward(model, fresh, [Segment([0, 2, 3], texts, logits="none")])
    for r, t in zip([0, 2, 3], texts, strict=True):
        fresh.lengths[r] = len(t)
        assert _same_kv(_row_kv(cache, r), _row_kv(fresh, r))
    # and the next step reads the same logits from both
    probe = [[9, 10], [11], [12, 13]]
    a = forward(model, cache, [Segment([0, 2, 3], probe)])[0]
    b = forward(model, fresh, [Segment([0, 2, 3], probe)])[0]
    assert _close(a, b)


def test_tree_compaction_keeps_the_accepted_path(make_tiny):
    model = _model(make_tiny, 4)
    cache = _prefill(model)
    # row 0 verifies a tree and accepts root -> node 2 -> node 3; row 3 a chain, keeps 2
    forward(
        model,
        cache,
        [Segment([0, 3], [[4, 5, 6, 7], [1, 2, 3]], parents=[[-1, 0, 0, 2], [-1, 0, 1]])],
    )
    cache.compact([0], [[0, 2, 3]])
    cache.lengths[0] += 3
    cache.lengths[3] += 2
    fresh = BatchKVCache(len(model.model.layers), 4, pad=0)
    texts = {0: PROMPTS[0] + [4, 6, 7], 3: PROMPTS[2] + [1, 2]}
    forward(model, fresh, [Segment(list(texts), list(texts.values()), logits="none")])
    for r, t in texts.items():
        fresh.lengths[r] = len(t)
        assert _same_kv(_row_kv(cache, r), _row_kv(fresh, r))


def test_reads_are_padded_to_the_pad(make_tiny):
    cache = BatchKVCache(2, 2, pad=64)
    assert cache.read_width(1) == 64 and cache.read_width(65) == 128
    cache.reserve(70)
    assert cache.size >= 128


def test_growth_keeps_the_rows(make_tiny):
    model = _model(make_tiny, 5)
    cache = _prefill(model)
    before = [_row_kv(cache, r) for r in (0, 2, 3)]
    long = np.arange(300).tolist()
    forward(model, cache, [Segment([1], [long], logits="none")])  # grows every layer past 256
    assert cache.size >= 300
    assert all(_same_kv(b, _row_kv(cache, r)) for b, r in zip(before, (0, 2, 3), strict=True))


def test_prefixes_copied_at_once_are_the_ones_copied_one_by_one():
    """Several joining rows copy their donors' prefixes in one gather and one update per
    layer array: each gets its own donor's first n positions and its length n; donors and
    rows not copied to keep theirs."""
    rng = np.random.default_rng(0)
    cache = BatchKVCache(2, 6, pad=0)
    cache.reserve(16)
    for layer in range(2):
        for arrays in (cache.keys, cache.values):
            arrays[layer] = mx.array(rng.standard_normal((6, 2, cache.size, 4)).astype(np.float32))
    cache.lengths[:] = [12, 10, 0, 0, 0, 7]
    before = [np.array(a) for a in cache.state()]
    copies = [(0, 3, 5), (1, 4, 9), (0, 2, 2)]
    cache.copy_prefixes(copies)
    after = [np.array(a) for a in cache.state()]
    assert cache.lengths.tolist() == [12, 10, 2, 5, 9, 7]
    for b, a in zip(before, after, strict=True):
        for src, dst, n in copies:
            assert np.array_equal(a[dst, :, :n], b[src, :, :n])
        for r in (0, 1, 5):
            assert np.array_equal(a[r], b[r])


def test_neighbouring_width_buckets_share_a_segment_where_padding_costs_less():
    """Buckets of rows by node count (in order of width) merge where the queries their
    padding adds cost less than a further segment (a row's query of the step's rows each):
    two-node rows join one-node rows; a lone nine-node row stays apart from 48 one-node
    rows; a bucket between two merges with the neighbour it costs less beside."""
    from core.engine.scorer import merge_widths

    ones, twos = list(range(33)), list(range(33, 49))
    assert merge_widths([(ones, 1), (twos, 2)]) == [ones + twos]
    assert merge_widths([(list(range(48)), 1), ([48], 9)]) == [list(range(48)), [48]]
    assert merge_widths([([2, 0], 1)]) == [[0, 2]]
    # 40 one-node rows, 4 of two, 20 of eight: two segments (a third costs 64 queries);
    # the twos join the eights (4 x 6 padded queries) rather than the ones (40 x 1)
    got = merge_widths([(list(range(40)), 1), (list(range(40, 44)), 2), (list(range(44, 64)), 8)])
    assert got == [list(range(40)), list(range(40, 64))]
    # a merge keeps every row exactly once, in order
    buckets = [([5, 1], 1), ([3], 2), ([0, 4], 3), ([2], 5)]
    groups = merge_widths(buckets)
    assert sorted(r for g in groups for r in g) == list(range(6))
    assert all(g == sorted(g) for g in groups)
