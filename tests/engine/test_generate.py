"""Speculative decoding is lossless: greedy output is token-identical to plain greedy decoding
for every drafter, and sampled output follows the target distribution."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from core.engine import Engine, GenerationParams, LoadedModel
from core.engine.forward import forward, make_cache, trim
from core.engine.tiny import tiny_model

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Label: positive. Text: I loved it. Label: negative. Text: awful. Label:",
    "def add(a, b):\n    return a + b\n\ndef add(",
]
DRAFTERS = [
    "ngram",
    "early-exit:1",
    "early-exit:3",
    "auto",
    "draft-model:same",
    "draft-model:other",
]


def engine_for(target, drafter, make_tiny, cost, k=None):
    kw = {}
    if drafter.startswith("draft-model"):
        kw["draft_model"] = target if drafter.endswith("same") else make_tiny(99)
    return Engine(target, draft=drafter, k=k, cost=cost, **kw)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_greedy_speculative_equals_plain(seed, drafter, make_tiny, flat_cost):
    target = make_tiny(seed, tie_word_embeddings=seed % 2 == 0)
    plain = Engine(target, draft="none", cost=flat_cost)
    for i, text in enumerate(PROMPTS):
        prompt = target.encode_prompt(text)
        params = GenerationParams(max_tokens=48)
        want = plain.generate(prompt, params)
        for k in (None, 1 + (seed + i) % 5):
            got = engine_for(target, drafter, make_tiny, flat_cost, k).generate(prompt, params)
            assert got.tokens == want.tokens, (drafter, k, text)
            assert got.finish_reason == want.finish_reason


def test_plain_greedy_equals_mlx_lm(make_tiny):
    target = make_tiny(1)
    prompt = target.encode_prompt(PROMPTS[1])
    ours = Engine(target, draft="none").generate(prompt, GenerationParams(max_tokens=40))
    theirs = [int(t) for t, _ in generate_step(mx.array(prompt), target.model, max_tokens=40)]
    # mlx-lm does not stop at EOS inside generate_step; compare up to our stop point.
    assert ours.tokens == theirs[: len(ours.tokens)]
    assert len(ours.tokens) == 40 or theirs[len(ours.tokens)] in target.eos_token_ids


def test_metrics_are_consistent(make_tiny, flat_cost):
    target = make_tiny(2)
    prompt = target.encode_prompt(PROMPTS[2] * 3)
    r = Engine(target, draft="ngram", k=4, cost=flat_cost).generate(
        prompt, GenerationParams(max_tokens=64)
    )
    s, t = r.speculative, r.timing
    assert s["drafter"] == "ngram"
    assert s["accepted_tokens"] <= s["draft_tokens"]
    assert sum(s["accepted_per_position"]) == s["accepted_tokens"]
    assert s["accepted_per_position"] == sorted(s["accepted_per_position"], reverse=True)
    # every step emits its accepted tokens plus one; the first token comes from the prefill
    assert s["accepted_tokens"] + s["verify_steps"] >= len(r.tokens) - 1
    assert s["mean_accepted_length"] >= 1.0
    for key in ("ttft_s", "draft_s", "verify_s", "accept_s", "cache_s", "total_s"):
        assert t[key] >= 0.0
    assert t["total_s"] >= t["ttft_s"]
    assert t["peak_memory_bytes"] > 0


def test_seeded_sampling_is_reproducible(make_tiny, flat_cost):
    target = make_tiny(3)
    prompt = target.encode_prompt(PROMPTS[0])
    params = GenerationParams(max_tokens=32, temperature=0.8, top_p=0.9, seed=7)
    a = Engine(target, draft="auto", cost=flat_cost).generate(prompt, params)
    b = Engine(target, draft="auto", cost=flat_cost).generate(prompt, params)
    assert a.tokens == b.tokens


@pytest.mark.parametrize("drafter", ["none", "ngram", "early-exit:2", "draft-model:noisy"])
def test_sampled_speculation_matches_target_distribution(drafter, tokenizer, flat_cost):
    """The first three generated tokens' joint distribution matches the target's exact one.

    A 1-layer model with a 6-token vocabulary; the exact target distribution of the first two
    tokens is computed by enumeration, then 800 seeded runs are compared with a chi-square
    bound (mean + 5 std: false alarms < 1e-5)."""
    V = 6
    kw = dict(
        vocab_size=V,
        hidden_size=16,
        num_layers=3,
        num_heads=2,
        num_kv_heads=1,
        intermediate_size=32,
        layer_scale=2.0,
    )
    target = LoadedModel("t", tiny_model(5, **kw), tokenizer, 4096)
    extra = {}
    if drafter == "draft-model:noisy":
        extra["draft_model"] = LoadedModel("d", tiny_model(6, **kw), tokenizer, 4096)
    prompt = [1, 2, 3, 4]
    params = lambda s: GenerationParams(max_tokens=2, temperature=1.0, seed=s)  # noqa: E731

    # exact p(t1, t2 | prompt) by enumeration over the target alone
    exact = np.zeros((V, V))
    cache = make_cache(target.model)
    p1 = mx.softmax(forward(target.model, mx.array([prompt]), cache)[0, -1]).tolist()
    for a in range(V):
        p2 = mx.softmax(forward(target.model, mx.array([[a]]), cache)[0, -1]).tolist()
        trim(cache, 1)
        exact[a] = np.array(p1[a]) * np.array(p2)
    eng = Engine(target, draft=drafter, k=3, cost=flat_cost, **extra)
    counts = np.zeros((V, V))
    runs = 800
    for s in range(runs):
        toks = eng.generate(prompt, params(s)).tokens
        counts[toks[0], toks[1]] += 1  # vocab 6 has no EOS: always two tokens
    from tests.engine.test_acceptance import chi_square_ok

    stat, bound = chi_square_ok(counts.ravel(), exact.ravel(), runs)
    assert stat < bound, (drafter, stat, bound)


def test_early_exit_shares_the_target_cache(make_tiny, flat_cost):
    """Early exit keeps no cache or weights of its own: after a request the target's cache
    holds exactly one entry per position, and no new parameters exist."""
    target = make_tiny(4)
    eng = Engine(target, draft="early-exit:2", k=3, cost=flat_cost)
    n_params = sum(v.size for v in _leaves(target.model))
    r = eng.generate(target.encode_prompt(PROMPTS[0]), GenerationParams(max_tokens=20))
    assert len(r.tokens) == 20
    assert sum(v.size for v in _leaves(target.model)) == n_params


def _leaves(m):
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(m.parameters())]


def test_cache_rollback_equals_fresh_prefill(make_tiny):
    """Trimming rejected positions leaves the cache equal to prefilling the kept tokens."""
    target = make_tiny(0)
    toks = mx.array([target.encode_prompt(PROMPTS[0])])
    a = make_cache(target.model)
    forward(target.model, toks, a)
    forward(target.model, mx.array([[5, 6, 7, 8]]), a)
    trim(a, 4)
    b = make_cache(target.model)
    forward(target.model, toks, b)
    probe = mx.array([[9, 10]])
    assert mx.allclose(forward(target.model, probe, a), forward(target.model, probe, b), atol=1e-5)


def test_eos_stops_and_is_not_returned(make_tiny, flat_cost):
    target = make_tiny(0)
    prompt = target.encode_prompt(PROMPTS[0])
    first = Engine(target, draft="none").generate(prompt, GenerationParams(max_tokens=1)).tokens[0]
    target_eos = LoadedModel(target.name, target.model, target.tokenizer, 4096)
    target_eos.tokenizer = type("T", (), {"eos_token_ids": {first}, "decode": target.decode})()
    for d in ("none", "ngram", "early-exit:2"):
        r = Engine(target_eos, draft=d, cost=flat_cost).generate(prompt, GenerationParams(8))
        assert r.tokens == [] and r.finish_reason == "stop"


@pytest.mark.parametrize(
    "spec", ["bogus", "early-exit", "early-exit:x", "early-exit:0", "early-exit:99", "ngram:3"]
)
def test_bad_drafter_spec(spec, make_tiny):
    with pytest.raises(ValueError, match="drafter|layer"):
        Engine(make_tiny(0), draft=spec)


def test_prompt_longer_than_context(make_tiny):
    t = make_tiny(0)
    short = LoadedModel(t.name, t.model, t.tokenizer, context_length=8)
    with pytest.raises(ValueError, match="context"):
        Engine(short, draft="none").generate(list(range(10)), GenerationParams())
