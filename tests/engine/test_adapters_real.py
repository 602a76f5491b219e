"""On the real default model: an early-exit adapter is within 5% of the target's
parameters, briefly trained it agrees more than plain early exit, and greedy decoding with
it reproduces plain greedy token for token."""

import pytest

from core.engine import CostSurface, Engine, GenerationParams
from core.engine.adapters import new_adapter, save
from core.engine.adapters.block import target_size
from core.engine.adapters.head import new_head
from core.engine.adapters.head import size as head_size
from core.models import load_model
from core.training.adapter import TrainConfig, evaluate, train
from core.training.data import answer, features

pytestmark = pytest.mark.real_model

PROMPTS = [
    "Write a short email to Ivan to ask a supplier for a delivery update.",
    "What is inflation in economics? Answer briefly.",
    "Write a short story about a haunted library in Pune.",
    "Write a Python function that counts the words in a text, with a docstring.",
]
HELD = "Write a short email to Chen to apologise to a customer for a late order."
FLAT = CostSurface.flat()


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


def test_adapter_is_within_five_percent_of_the_target(smollm2):
    for layer in (4, 8, 29):
        assert new_adapter(smollm2.model, layer).size() <= 0.05 * target_size(smollm2.model)
    assert head_size(new_head(smollm2.model)) <= 0.05 * target_size(smollm2.model)


@pytest.mark.slow
def test_trained_adapter_is_lossless_on_the_real_model(smollm2, tmp_path, monkeypatch):
    L = 6
    chats = [smollm2.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    held = [smollm2.encode_chat([{"role": "user", "content": HELD}])]
    train_f = features(smollm2, answer(smollm2, chats, 32), L)
    held_f = features(smollm2, answer(smollm2, held, 32), L)
    adapter = new_adapter(smollm2.model, L)
    r = train(smollm2.model, adapter, train_f, held_f, TrainConfig(tokens=600, eval_every=0))
    early, _ = evaluate(smollm2.model, None, held_f)
    assert r.after > early
    # (answered above with the machine's measured cost surface; the adapter goes elsewhere)
    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    save(smollm2, adapter, {"agreement": r.after})
    params = GenerationParams(max_tokens=32)
    for prompt in (held[0], chats[1]):
        want = Engine(smollm2, draft="none", surface=FLAT, batch_size=1).generate(prompt, params)
        for k in (3, None):
            eng = Engine(smollm2, draft="adapter:6", k=k, surface=FLAT, batch_size=1)
            got = eng.generate(prompt, params)
            assert got.tokens == want.tokens, k


@pytest.mark.slow
def test_the_heads_resident_loop_is_lossless_on_the_real_model(smollm2, tmp_path, monkeypatch):
    """The head's resident loop (core/engine/resident.py) on the real model: alone, token
    for token plain greedy; in a batch, each row equals its single-row output or differs
    first at a near-tie of it (batched matmuls round by batch shape)."""
    import json

    from core.benchmark import GAP_BUG, first_difference, top_gap
    from core.engine.costs import surface_path
    from tests.engine.conftest import store_head

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    kept = surface_path(smollm2.model, smollm2.weight_format)  # (the answers need no timing)
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(FLAT.to_json()))
    chats = [smollm2.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    store_head(smollm2, tokens=600, prompts=chats)
    reqs = [(p, GenerationParams(max_tokens=32)) for p in [*chats, *chats[:2]]]
    plain = Engine(smollm2, draft="none", surface=FLAT, batch_size=1)
    want = [plain.generate(p, q).tokens for p, q in reqs]
    # (chains of a fixed length: FLAT prices a forward at 1 ms, next to which the head's
    # timed depths would choose none)
    alone = Engine(smollm2, draft="head", surface=FLAT, batch_size=1, resident=True, k=1)
    assert [alone.generate(p, q).tokens for p, q in reqs[:2]] == want[:2]
    batched = Engine(smollm2, draft="head", surface=FLAT, batch_size=4, resident=True, k=2)
    got = batched.generate_many(reqs)  # six rows through four: the loop is left to admit
    assert sum(r.speculative["draft_tokens"] for r in got) > 0
    for (prompt, _), w, g in zip(reqs, want, got, strict=True):
        if g.tokens != w:
            j = first_difference(g.tokens, w)
            assert top_gap(smollm2, prompt, w[:j]) < GAP_BUG, j
