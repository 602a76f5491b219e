"""On the real default model every drafter reproduces plain greedy decoding token for token."""

import pytest

from core.engine import CostCurve, Engine, GenerationParams, load_model

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Copy the review, then add its sentiment in brackets.\nReview: Terrible sound quality, "
    "I returned it.",
    "Extract the person's name and email as JSON.\nText: John Smith, reachable at "
    "john.smith@example.org, lives in Boston.",
]


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


@pytest.mark.parametrize("text", PROMPTS)
def test_every_drafter_equals_plain_greedy(smollm2, text):
    prompt = smollm2.encode_chat([{"role": "user", "content": text}])
    params = GenerationParams(max_tokens=32)
    want = Engine(smollm2, draft="none").generate(prompt, params).tokens
    flat = CostCurve.flat()  # width is free: every drafter drafts on every step
    for spec in ("ngram", "early-exit:8", "early-exit:27", "auto", "tree"):
        k = None if spec == "tree" else 3
        got = Engine(smollm2, draft=spec, k=k, cost=flat).generate(prompt, params)
        assert got.tokens == want, spec
