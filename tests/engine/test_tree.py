"""Token trees: flat arrays, mask and positions, builders, merging."""

import mlx.core as mx
import pytest

from core.engine.tree import (
    TokenTree,
    best_first,
    dynamic_tree,
    merge,
    parse_shape,
    static_tree,
)


def _tree() -> TokenTree:
    # root(9) -> 1(3), 2(4); 1 -> 3(5); 2 -> 4(6), 5(7)
    t = TokenTree.root(9)
    a = t.add(0, 3, 0.5)
    b = t.add(0, 4, 0.3)
    t.add(a, 5, 0.4)
    t.add(b, 6, 0.2)
    t.add(b, 7, 0.1)
    return t


def test_flat_arrays_mask_and_positions():
    t = _tree()
    assert t.tokens == [9, 3, 4, 5, 6, 7]
    assert t.parents == [-1, 0, 0, 1, 2, 2]
    assert t.depths() == [0, 1, 1, 2, 2, 2]
    assert t.positions(10).tolist() == [10, 11, 11, 12, 12, 12]
    m = t.attention_mask(2)
    assert m.shape == (6, 8)
    assert m[:, :2].all().item()  # everyone sees the prefix
    assert m[3, 2:].tolist() == [True, True, False, True, False, False]  # root, 1, itself
    assert m[5, 2:].tolist() == [True, False, True, False, False, True]
    assert t.path_tokens(5) == [9, 4, 7]


def test_add_deduplicates_siblings():
    t = TokenTree.root(1)
    assert t.add(0, 5, 0.2) == t.add(0, 5, 0.6) == 1
    assert t.size == 2 and t.scores[1] == 0.6


def test_draft_round_trip():
    t = _tree()
    d = t.to_draft("x")
    assert d.tokens.tolist() == [[3, 4, 5, 6, 7]]
    assert d.parents.tolist() == [-1, -1, 0, 1, 1]
    back = TokenTree.from_draft(9, d)
    assert (back.tokens, back.parents) == (t.tokens, t.parents)
    chain = TokenTree.from_draft(1, type(d)(tokens=mx.array([[2, 3]])))
    assert chain.parents == [-1, 0, 1]


def _expand(path):
    # Candidates depend on the path: the next token is last + 1 (likely) or last + 2.
    last = path[-1]
    return [(last + 1, 0.6), (last + 2, 0.3), (last + 3, 0.1)]


def test_static_tree_shape():
    t = static_tree(0, _expand, [3, 2, 1])
    assert t.size == 1 + 3 + 6 + 6
    assert t.depths().count(3) == 6
    assert t.path_tokens(t.size - 1)[-1] == t.path_tokens(t.size - 1)[-2] + 1


def test_dynamic_tree_takes_the_most_likely_nodes():
    t = dynamic_tree(0, _expand, budget=5, width=3)
    assert t.size == 6
    # cumulative probabilities: 1:.6, 1->2:.36, 2:.3, 1->2->3:.216, 1->3:.18 / 2->3:.18
    assert sorted(t.scores[1:], reverse=True)[:4] == pytest.approx([0.6, 0.36, 0.3, 0.216])
    assert all(t.scores[i] <= t.scores[t.parents[i]] for i in range(1, t.size))


def test_merge_joins_paths_and_dedups():
    a = TokenTree([9, 1, 2], [-1, 0, 1], [1.0, 0.9, 0.8])
    b = TokenTree([9, 1, 5, 3], [-1, 0, 1, 0], [1.0, 0.5, 0.4, 0.3])
    m = merge([a, b])
    assert m.tokens == [9, 1, 2, 5, 3]
    assert m.parents == [-1, 0, 1, 1, 0]
    assert m.scores[1] == 0.9
    with pytest.raises(ValueError, match="share the root"):
        merge([a, TokenTree.root(8)])


def test_best_first_keeps_a_tree():
    t = best_first(_tree(), 3)
    assert t.tokens == [9, 3, 4, 5]
    assert t.parents == [-1, 0, 0, 1]


def test_parse_shape():
    assert parse_shape("3,2,1") == [3, 2, 1]
    with pytest.raises(ValueError, match="comma-separated"):
        parse_shape("3,x")
    with pytest.raises(ValueError, match="at least 1"):
        parse_shape("2,0")
