"""OpenAI's request fields in the engine: stop, n, logprobs / top_logprobs, logit_bias and the
frequency / presence penalties. Speculative output equals plain decoding's (greedy and
seeded); plain decoding equals a step-by-step reference on the model's own logits; sampled
output follows the penalised target distribution."""

import mlx.core as mx
import numpy as np
import pytest

from core.engine import CostSurface, Engine, GenerationParams
from tests.engine.conftest import SMALL_VOCAB

FLAT = CostSurface.flat()
TEXT = "Copy: the red car, the red car, the red car, the red"
DRAFTERS = ["ngram", "tree", "auto", "early-exit:2"]


def run(target, spec, prompt, params, batch=3, **kw):
    if spec == "auto":
        kw = {"draft_model": target, "draft_cost": 0.1, **kw}
    return Engine(target, draft=spec, surface=FLAT, batch_size=batch, **kw).generate(prompt, params)


def reference(model, prompt, n, bias=None, freq=0.0, pres=0.0):
    """Plain greedy with OpenAI's logit adjustments, one token at a time on mlx-lm's model."""
    out = []
    for _ in range(n):
        logits = np.array(model(mx.array([prompt + out]))[0, -1].astype(mx.float32))
        for t, b in (bias or {}).items():
            logits[int(t)] += b
        for t in set(out):
            logits[t] -= freq * out.count(t) + pres
        out.append(int(np.argmax(logits)))
    return out


@pytest.fixture
def target(make_tiny):
    return make_tiny(8)


@pytest.mark.parametrize("spec", ["none", *DRAFTERS])
def test_stop_strings_and_token_ids_cut_exactly_where_plain_decoding_does(target, spec):
    prompt = target.encode_prompt(TEXT)
    free = run(target, "none", prompt, GenerationParams(max_tokens=40), batch=1)
    assert len(free.tokens) > 6
    # a stop string taken from the middle of the free answer, and a token-id sequence
    text = free.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    got = run(target, spec, prompt, GenerationParams(max_tokens=40, stop=[stop]))
    assert got.finish_reason == "stop" and got.text == text[: text.find(stop)]
    ids = free.tokens[5:7]
    got = run(target, spec, prompt, GenerationParams(max_tokens=40, stop=[ids]))
    cut = next(i for i in range(len(free.tokens)) if free.tokens[i : i + 2] == ids)
    assert got.tokens == free.tokens[:cut] and got.finish_reason == "stop"


@pytest.mark.parametrize("spec", ["none", *DRAFTERS])
def test_bias_and_penalties_equal_the_step_by_step_reference(target, spec):
    prompt = target.encode_prompt(TEXT)
    bias = {str(target.encode_prompt(" car")[0]): -5.0, "101": 2.5}
    params = GenerationParams(
        max_tokens=24, logit_bias=bias, frequency_penalty=0.7, presence_penalty=0.4
    )
    want = reference(target.model, prompt, 24, bias, 0.7, 0.4)
    got = run(target, spec, prompt, params)
    assert got.tokens == want[: len(got.tokens)]
    assert len(got.tokens) == 24 or got.finish_reason == "stop"


@pytest.mark.parametrize("spec", ["none", "ngram", "tree"])
def test_logprobs_are_the_targets_own(target, spec):
    prompt = target.encode_prompt(TEXT)
    params = GenerationParams(max_tokens=12, logprobs=True, top_logprobs=3)
    r = run(target, spec, prompt, params)
    lps = r.choices[0].logprobs
    assert [x["id"] for x in lps] == r.tokens
    for i, (t, rec) in enumerate(zip(r.tokens, lps, strict=True)):
        logits = target.model(mx.array([prompt + r.tokens[:i]]))[0, -1].astype(mx.float32)
        lp = np.array(logits - mx.logsumexp(logits))
        assert rec["logprob"] == pytest.approx(float(lp[t]), abs=1e-4)
        tops = [x["id"] for x in rec["top_logprobs"]]
        assert tops == list(np.argsort(-lp)[:3]) and tops[0] == t  # greedy: the best one
        assert rec["token"] == target.decode([t])


def test_n_answers_are_the_seeded_answers_one_by_one(target):
    prompt = target.encode_prompt(TEXT)
    params = GenerationParams(max_tokens=16, temperature=0.9, seed=40, n=3)
    r = Engine(target, draft="ngram", surface=FLAT, batch_size=4).generate(prompt, params)
    assert len(r.choices) == 3
    for i, c in enumerate(r.choices):
        alone = GenerationParams(max_tokens=16, temperature=0.9, seed=40 + i)
        assert c.tokens == run(target, "none", prompt, alone, batch=1).tokens
    assert len({tuple(c.tokens) for c in r.choices}) > 1
    greedy = Engine(target, draft="ngram", surface=FLAT, batch_size=4).generate(
        prompt, GenerationParams(max_tokens=8, n=2)
    )
    assert greedy.choices[0].tokens == greedy.choices[1].tokens


def test_sampled_output_follows_the_penalised_target(small_vocab):
    """First two tokens over 600 seeds against the exact distribution with a presence and a
    frequency penalty (the second token's logits penalised by the first) and a logit bias."""
    from tests.engine.test_acceptance import chi_square_ok

    V = SMALL_VOCAB
    target = small_vocab(5)
    prompt = [1, 2, 3, 4]
    bias, freq, pres = {"2": 1.5}, 0.8, 0.6

    def dist(logits, generated):
        x = np.array(logits.astype(mx.float32))
        x[2] += 1.5
        for t in set(generated):
            x[t] -= freq * generated.count(t) + pres
        e = np.exp(x - x.max())
        return e / e.sum()

    p1 = dist(target.model(mx.array([prompt]))[0, -1], [])
    exact = np.zeros((V, V))
    for a in range(V):
        exact[a] = p1[a] * dist(target.model(mx.array([prompt + [a]]))[0, -1], [a])
    runs = 600
    counts = np.zeros((V, V))
    eng = Engine(target, draft="ngram", k=2, surface=FLAT, batch_size=3)
    for s in range(0, runs, 3):
        reqs = [
            (
                prompt,
                GenerationParams(
                    max_tokens=2,
                    temperature=1.0,
                    seed=s + i,
                    logit_bias=bias,
                    frequency_penalty=freq,
                    presence_penalty=pres,
                ),
            )
            for i in range(3)
        ]
        for r in eng.generate_many(reqs):
            counts[r.tokens[0], r.tokens[1]] += 1
    stat, bound = chi_square_ok(counts.ravel(), exact.ravel(), runs)
    assert stat < bound, (stat, bound)
