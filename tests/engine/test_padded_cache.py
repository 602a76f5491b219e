"""Padded multi-token attention reads (the CUDA path, `forward.kv_pad`) change nothing but
the shapes: same logits as mlx-lm's cache, same greedy output for every drafter."""

import mlx.core as mx
import numpy as np
import pytest

from core.engine import Engine, GenerationParams
from core.engine.forward import PaddedKVCache, forward, last_logits, make_cache, trim


def test_padded_reads_give_the_same_logits(make_tiny):
    model = make_tiny(0).model
    plain = make_cache(model)
    padded = [PaddedKVCache(8) for _ in plain]
    rng = np.random.default_rng(0)
    steps = [(13, 0), (5, 2), (1, 0), (7, 7), (3, 1), (30, 4), (2, 0)]  # (width, rejected)
    for width, rejected in steps:
        toks = mx.array(rng.integers(0, 256, (1, width)), dtype=mx.int32)
        a, b = forward(model, toks, plain), forward(model, toks, padded)
        np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4, rtol=1e-4)
        trim(plain, rejected)
        trim(padded, rejected)
    assert plain[0].offset == padded[0].offset
    k, _ = padded[0].update_and_fetch(mx.zeros((1, 2, 3, 16)), mx.zeros((1, 2, 3, 16)))
    assert k.shape[2] % 8 == 0  # the read really is padded


def test_make_cache_pads_only_when_asked(make_tiny, monkeypatch):
    model = make_tiny(0).model
    monkeypatch.setenv("APPLESPEC_KV_PAD", "16")
    assert all(isinstance(c, PaddedKVCache) and c.pad == 16 for c in make_cache(model))
    monkeypatch.setenv("APPLESPEC_KV_PAD", "0")
    assert not any(isinstance(c, PaddedKVCache) for c in make_cache(model))


@pytest.mark.parametrize("drafter", ["ngram", "early-exit:2", "tree", "draft-model:other"])
def test_greedy_output_is_unchanged_by_padding(drafter, make_tiny, flat_cost, monkeypatch):
    target = make_tiny(1)
    extra = {"draft_model": make_tiny(99)} if drafter.startswith("draft-model") else {}
    prompt = target.encode_prompt("Label: positive. Text: I loved it. Label: negative. Text:")
    params = GenerationParams(max_tokens=40)
    want = Engine(target, draft="none", cost=flat_cost).generate(prompt, params).tokens
    monkeypatch.setenv("APPLESPEC_KV_PAD", "8")
    got = Engine(target, draft=drafter, cost=flat_cost, **extra).generate(prompt, params)
    assert got.tokens == want


def test_last_logits_equal_the_full_forward_last_row(make_tiny):
    model = make_tiny(2).model
    toks = mx.array([[5, 17, 99, 3, 250, 42, 7]], dtype=mx.int32)
    a, b = make_cache(model), make_cache(model)
    full = forward(model, toks, a)[:, -1]
    last = last_logits(model, toks, b)
    np.testing.assert_allclose(np.array(full), np.array(last), atol=1e-5, rtol=1e-5)
    assert a[0].offset == b[0].offset == toks.shape[1]


def test_a_bad_pad_setting_is_a_clear_error(make_tiny, monkeypatch):
    monkeypatch.setenv("APPLESPEC_KV_PAD", "sixty-four")
    with pytest.raises(ValueError, match="APPLESPEC_KV_PAD must be a whole number"):
        make_cache(make_tiny(0).model)
