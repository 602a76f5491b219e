"""Structured output is lossless: with a `response_format`, every row's greedy output equals
plain constrained greedy decoding (mask, argmax, advance) token for token, for every drafter
and whatever shares the batch; sampled rows follow the masked, renormalised distribution;
every answer is valid JSON under its schema."""

import json

import llguidance
import llguidance.numpy as llnp
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from core.engine import CostSurface, Engine, GenerationParams
from core.engine.grammar import GrammarError, check_format, compile_format
from tests.engine.test_generate import PROMPTS, engine

FLAT = CostSurface.flat()
# Schemas whose answers a random byte-level model finishes (bounded strings and numbers).
TINY_SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "tag": {"type": "string", "maxLength": 6},
        "score": {"type": "integer", "minimum": 0, "maximum": 99},
        "flags": {
            "type": "array",
            "items": {"enum": ["a", "bc"]},
            "minItems": 1,
            "maxItems": 3,
        },
    },
    "required": ["label", "tag", "score", "flags"],
    "additionalProperties": False,
}
TINY_FORMAT = {"type": "json_schema", "json_schema": {"name": "t", "schema": TINY_SCHEMA}}
DRAFTERS = ["none", "ngram", "suffix", "tree", "head", "forced", "auto", "early-exit:1"]


def constrained_greedy(target, prompt, response_format, max_tokens):
    """The reference: plain decoding with mlx-lm's model and cache, one token at a time,
    each chosen as the argmax of the logits masked by llguidance's mask (numpy)."""
    grammar = compile_format(response_format, target.tokenizer, target.vocab_size)
    matcher = llguidance.LLMatcher(grammar.tokenizer, grammar.grammar)
    cache = make_prompt_cache(target.model)
    logits = target.model(mx.array([prompt]), cache=cache)[:, -1]
    out = []
    for _ in range(max_tokens):
        bits = llnp.allocate_token_bitmask(1, target.vocab_size)
        llnp.fill_next_token_bitmask(matcher, bits)
        host = np.array(logits.astype(mx.float32))
        llnp.apply_token_bitmask_inplace(host, bits)
        t = int(host[0].argmax())
        if t in target.eos_token_ids:
            break
        out.append(t)
        assert matcher.consume_token(t)
        logits = target.model(mx.array([[t]]), cache=cache)[:, -1]
    return out


def _requests(target, constrained=(0, 1, 3), max_tokens=150):
    return [
        (
            target.encode_prompt(p),
            GenerationParams(
                max_tokens=max_tokens, response_format=TINY_FORMAT if i in constrained else None
            ),
        )
        for i, p in enumerate(PROMPTS)
    ]


@pytest.mark.slow
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_constrained_greedy_equals_the_step_by_step_reference(drafter, make_tiny):
    """Five requests through three rows (rows join mid-batch), rows with and without a
    schema in one batch, adaptive and fixed k: each row equals its reference alone."""
    target = make_tiny(0)
    reqs = _requests(target)
    want = []
    for prompt, params in reqs:
        if params.response_format is None:
            e = Engine(target, draft="none", surface=FLAT, batch_size=1)
            want.append(e.generate(prompt, params).tokens)
        else:
            want.append(constrained_greedy(target, prompt, TINY_FORMAT, params.max_tokens))
    for k in (None, 3):
        got = engine(target, drafter, make_tiny, k=k, batch=3).generate_many(reqs)
        assert [r.tokens for r in got] == want, (drafter, k)
        for r, (_, params) in zip(got, reqs, strict=True):
            if params.response_format is not None:
                answer = json.loads(r.text)
                assert set(answer) == set(TINY_SCHEMA["properties"])
                assert r.speculative["forced_tokens"] > 0


def test_forced_tokens_are_drafted_and_accepted(make_tiny):
    target = make_tiny(0)
    reqs = _requests(target, constrained=range(5))
    # (step modes off: their trials time the machine, and may run plain steps a while)
    got = engine(target, "auto", make_tiny, batch=5, step_modes=False).generate_many(reqs)
    drafted = sum(r.speculative["draft_tokens_by_drafter"].get("forced", 0) for r in got)
    accepted = sum(r.speculative["accepted_by_drafter"].get("forced", 0) for r in got)
    assert drafted > 0 and accepted > 0.9 * drafted
    steps = sum(r.speculative["verify_steps"] for r in got)
    assert sum(len(r.tokens) for r in got) / steps > 2.0  # forced keys and punctuation


@pytest.mark.slow
def test_penalties_bias_logprobs_stop_and_n_beside_a_grammar(make_tiny):
    """Each alongside the grammar, through `auto`: equal to the same request through plain
    decoding (`none`), and the answers still parse."""
    target = make_tiny(1)
    prompt = target.encode_prompt(PROMPTS[1])
    cases = [
        GenerationParams(max_tokens=150, frequency_penalty=0.5, presence_penalty=0.3),
        GenerationParams(max_tokens=150, logit_bias={str(ord("b")): 5.0}),
        GenerationParams(max_tokens=150, logprobs=True, top_logprobs=2),
        GenerationParams(max_tokens=150, n=3, temperature=1.0, seed=7),
    ]
    for params in cases:
        params.response_format = TINY_FORMAT
        plain = Engine(target, draft="none", surface=FLAT, batch_size=4).generate(prompt, params)
        spec = engine(target, "auto", make_tiny, batch=4).generate(prompt, params)
        assert [c.tokens for c in spec.choices] == [c.tokens for c in plain.choices], params
        for c in spec.choices:
            json.loads(c.text)
        if params.logprobs:
            lp = [x["logprob"] for x in spec.choices[0].logprobs]
            assert lp == pytest.approx([x["logprob"] for x in plain.choices[0].logprobs])
            assert all(v <= 0 for v in lp)
    stop = GenerationParams(max_tokens=150, stop=['"tag"'], response_format=TINY_FORMAT)
    r = engine(target, "auto", make_tiny, batch=4).generate(prompt, stop)
    assert r.finish_reason == "stop" and r.text.startswith('{"label": "')


ENUM_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "e", "schema": {"enum": ["ab", "ac", "b"]}},
}


def _enum_probs(target, prompt):
    """The exact probability of each answer of ENUM_FORMAT: the product over its tokens of
    the masked, renormalised target distribution (temperature 1)."""
    out = {}
    for answer in ('"ab"', '"ac"', '"b"'):
        tokens = target.encode_text(answer)
        logits = target.model(mx.array([prompt + tokens]))[0, len(prompt) - 1 :]
        grammar = compile_format(ENUM_FORMAT, target.tokenizer, target.vocab_size)
        matcher = llguidance.LLMatcher(grammar.tokenizer, grammar.grammar)
        p = 1.0
        for j, t in enumerate(tokens):
            bits = llnp.allocate_token_bitmask(1, target.vocab_size)
            llnp.fill_next_token_bitmask(matcher, bits)
            host = np.array(logits[j : j + 1].astype(mx.float32), np.float64)
            llnp.apply_token_bitmask_inplace(host, bits)
            probs = np.exp(host[0] - host[0].max())
            p *= probs[t] / probs.sum()
            matcher.consume_token(t)
        out[answer] = p
    return out


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["none", "ngram", "auto"])
def test_sampled_constrained_rows_follow_the_masked_distribution(drafter, make_tiny):
    """Three rows with different prompts share each batch; per row, the answer's
    distribution over 600 seeds matches the exact masked one (chi-square, mean + 5 sd)."""
    from tests.engine.test_acceptance import chi_square_ok

    target = make_tiny(3)
    prompts = [target.encode_prompt(p) for p in PROMPTS[:3]]
    exact = [_enum_probs(target, p) for p in prompts]
    for e in exact:
        assert sum(e.values()) == pytest.approx(1.0, abs=1e-4)
    eng = engine(target, drafter, make_tiny, k=3, batch=3)
    runs = 600
    counts = [dict.fromkeys(exact[0], 0) for _ in prompts]
    for s in range(runs):
        reqs = [
            (p, GenerationParams(max_tokens=8, temperature=1.0, seed=s * 3 + i))
            for i, p in enumerate(prompts)
        ]
        for _, params in reqs:
            params.response_format = ENUM_FORMAT
        for i, r in enumerate(eng.generate_many(reqs)):
            counts[i][r.text] += 1
    for i in range(len(prompts)):
        keys = list(exact[i])
        obs = np.array([counts[i][k] for k in keys], float)
        stat, bound = chi_square_ok(obs, np.array([exact[i][k] for k in keys]), runs)
        assert stat < bound, (drafter, i, counts[i], exact[i])


def test_a_schema_is_compiled_once_per_process(make_tiny):
    from core.engine import grammar

    target = make_tiny(0)
    schema = {"type": "object", "properties": {"once": {"type": "boolean"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}
    before = grammar.compiles
    eng = Engine(target, draft="none", surface=FLAT, batch_size=4)
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=20, response_format=rf))
        for p in PROMPTS
    ]
    eng.generate_many(reqs)
    # The same schema under another name, strictness and spacing: the same grammar.
    same = {"type": "json_schema", "json_schema": {"name": "p", "strict": True, "schema": schema}}
    compile_format(same, target.tokenizer, target.vocab_size)
    assert grammar.compiles == before + 1


@pytest.mark.parametrize(
    "schema, says",
    [
        ({"type": "object", "not": {"required": ["a"]}}, "not"),
        ({"type": "string", "format": "credit-card"}, "credit-card"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
    ],
)
def test_an_unsupported_schema_names_what(schema, says, make_tiny):
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(GrammarError, match=says):
        check_format(rf, make_tiny(0).tokenizer)
