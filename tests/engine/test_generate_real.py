"""On the real default model every drafter reproduces plain greedy decoding: token for
token for one row; in a batch, rows equal their single-row output or differ first at a
near-tie of the reference (batched matmuls round differently)."""

import pytest

from core.benchmark import GAP_BUG, first_difference, top_gap
from core.engine import CostSurface, Engine, GenerationParams
from core.models import load_model

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Copy the review, then add its sentiment in brackets.\nReview: Terrible sound quality, "
    "I returned it.",
    "Extract the person's name and email as JSON.\nText: John Smith, reachable at "
    "john.smith@example.org, lives in Boston.",
    "Label each ticket billing or shipping: 1. I was charged twice. 2. My parcel is late.",
    "What causes the seasons on Earth? Answer briefly.",
]
FLAT = CostSurface.flat()  # width is free: every drafter drafts on every step


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


def _prompt(model, text):
    return model.encode_chat([{"role": "user", "content": text}])


@pytest.mark.slow
@pytest.mark.parametrize("text", PROMPTS[:2])
def test_every_drafter_equals_plain_greedy_alone(smollm2, text):
    prompt = _prompt(smollm2, text)
    params = GenerationParams(max_tokens=32)
    plain = Engine(smollm2, draft="none", surface=FLAT, batch_size=1)
    want = plain.generate(prompt, params).tokens
    for spec in ("ngram", "early-exit:8", "early-exit:27", "auto", "tree"):
        k = None if spec == "tree" else 3
        got = Engine(smollm2, draft=spec, k=k, surface=FLAT, batch_size=1).generate(prompt, params)
        assert got.tokens == want, spec


@pytest.mark.slow
@pytest.mark.parametrize("spec", ["none", "auto", "tree"])
def test_batched_rows_equal_single_rows_up_to_near_ties(smollm2, spec):
    reqs = [(_prompt(smollm2, t), GenerationParams(max_tokens=32)) for t in PROMPTS]
    alone = Engine(smollm2, draft="none", surface=FLAT, batch_size=1)
    want = [alone.generate(p, q).tokens for p, q in reqs]
    got = Engine(smollm2, draft=spec, surface=FLAT, batch_size=4).generate_many(reqs)
    for (prompt, _), w, g in zip(reqs, want, got, strict=True):
        if g.tokens != w:
            j = first_difference(g.tokens, w)
            assert top_gap(smollm2, prompt, w[:j]) < GAP_BUG, (spec, j)
