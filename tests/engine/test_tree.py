"""Token trees: flat arrays, builders, merging; the tree drafter's chances and order."""

import pytest

from core.engine import CostSurface, Engine, GenerationParams
from core.engine.drafters.tree import RankStats, by_chance, chances
from core.engine.tree import TokenTree, best_first, dynamic_tree, merge


def _tree() -> TokenTree:
    # root(9) -> 1(3), 2(4); 1 -> 3(5); 2 -> 4(6), 5(7)
    t = TokenTree.root(9)
    a = t.add(0, 3, 0.5)
    b = t.add(0, 4, 0.3)
    t.add(a, 5, 0.4)
    t.add(b, 6, 0.2)
    t.add(b, 7, 0.1)
    return t


def test_add_deduplicates_siblings():
    t = TokenTree.root(1)
    assert t.add(0, 5, 0.2) == t.add(0, 5, 0.6) == 1
    assert t.size == 2 and t.scores[1] == 0.6


def _expand(path):
    # Candidates depend on the path: the next token is last + 1 (likely) or last + 2.
    last = path[-1]
    return [(last + 1, 0.6), (last + 2, 0.3), (last + 3, 0.1)]


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


def test_chances_use_the_first_child_rate_then_the_rank_rates():
    t = _tree()  # root -> 3, 4; 3 -> 5; 4 -> 6, 7
    ch = chances(t, lambda depth: [0.8, 0.5][depth], lambda rank: 0.25)
    assert ch[1] == pytest.approx(0.8)  # first child of the root
    assert ch[2] == pytest.approx(0.2 * 0.25)  # second: after the first failed
    assert ch[3] == pytest.approx(0.8 * 0.5)  # first child at depth 2
    assert ch[4] == pytest.approx(0.05 * 0.5) and ch[5] == pytest.approx(0.05 * 0.5 * 0.25)


def test_by_chance_orders_nodes_with_parents_first():
    t = _tree()
    ch = [1.0, 0.8, 0.05, 0.4, 0.025, 0.00625]
    out, kept = by_chance(t, ch, 4)
    assert out.tokens == [9, 3, 5, 4, 6] and out.parents == [-1, 0, 1, 0, 3]
    assert kept == sorted(kept, reverse=True)


def test_rank_stats_learn_from_observations():
    r = RankStats(prior=(0.25,), weight=1.0)
    for _ in range(30):
        r.observe(1, True)
    assert r.rate(1) > 0.9 and r.rate(2) == pytest.approx(0.25)


def test_a_tree_accepts_at_least_what_prompt_lookup_chains_do(make_tiny):
    """The tree's first branch is prompt lookup's chain: on copy-heavy prompts it never
    takes more verify steps than the ngram chain (free width; every step drafts)."""
    target = make_tiny(0)
    text = "Copy: alpha beta gamma delta. Copy again: alpha beta gamma delta. Again: alpha"
    prompt = target.encode_prompt(text)
    params = GenerationParams(max_tokens=40)
    flat = CostSurface.flat()
    steps = {}
    for spec in ("ngram", "tree"):
        engine = Engine(target, draft=spec, surface=flat, batch_size=1, step_modes=False)
        steps[spec] = engine.generate(prompt, params).speculative["verify_steps"]
    assert steps["tree"] <= steps["ngram"]
