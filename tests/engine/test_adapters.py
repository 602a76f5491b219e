"""Trained self-drafters on tiny float32 models: training lowers the KL and raises held-out
agreement; the store round-trips and refuses corrupt and foreign files with a clear error;
the engine falls back or names `applespec calibrate` when no adapter is usable."""

import shutil

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_map

from core.engine import CostSurface, Engine, GenerationParams
from core.engine.adapters import (
    AdapterError,
    best,
    load,
    model_key,
    new_adapter,
    save,
    stored,
)
from core.engine.adapters.block import draft_hidden, prefix_hidden, target_size, weight_share
from core.engine.adapters.store import adapters_dir, promise
from core.engine.draft_length import best_length, expected_tokens
from core.engine.scorer import head
from core.models import LoadedModel
from core.models.tiny import tiny_model
from core.training.adapter import TrainConfig, evaluate, train
from core.training.data import answer, features, split
from tests.engine.conftest import store_adapter

FLAT = CostSurface.flat()
# A templated workload: training and held-out prompts share the template, not the wording.
WORDS = ["red", "blue", "green", "big", "small", "old", "new", "fast"]
THINGS = ["car", "cat", "cup", "tree", "road", "book", "lamp", "door"]
WORKLOAD = [f"Item {i}: the {WORDS[i % 8]} {THINGS[(i * 3) % 8]} is number {i}." for i in range(48)]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    return tmp_path


def _data(target, layer):
    train_p, held_p = split([target.encode_prompt(t) for t in WORKLOAD], 0.25, seed=0)
    train_ex = answer(target, train_p, 20, samples=1)
    held_ex = answer(target, held_p, 20)
    return train_p, held_p, features(target, train_ex, layer), features(target, held_ex, layer)


def test_split_holds_out_distinct_prompts_never_trained_on():
    prompts = [[i % 10, 1] for i in range(40)]  # 10 distinct prompts, each 4 times
    train_p, held_p = split(prompts, 0.2)
    assert len(train_p) + len(held_p) == 10 and len(held_p) == 2
    assert not {tuple(p) for p in train_p} & {tuple(p) for p in held_p}
    assert split(prompts, 0.2) == (train_p, held_p)  # seeded


@pytest.mark.slow
def test_training_lowers_the_kl_and_raises_held_out_agreement(make_tiny):
    target = make_tiny(0)
    _, held_p, train_f, held_f = _data(target, 2)
    assert held_p
    adapter = new_adapter(target.model, 2)
    cfg = TrainConfig(tokens=6000, eval_every=2000, batch_tokens=512, seed=0)
    r = train(target.model, adapter, train_f, held_f, cfg)
    assert r.kl_after < 0.5 * r.kl_before
    assert r.after >= r.before + 0.15, (r.before, r.after)
    assert r.curve[0] == (0, r.before) and r.curve[-1] == (r.tokens, r.after)
    assert len(r.curve) >= 4
    early, _ = evaluate(target.model, None, held_f)
    assert r.after > early + 0.15
    # Seeded: the same data and settings train the same adapter.
    again = new_adapter(target.model, 2)
    r2 = train(target.model, again, train_f, held_f, cfg)
    assert r2.curve == r.curve and r2.losses == r.losses


@pytest.mark.slow
def test_training_over_a_float16_quantized_target_learns_and_stays_finite(make_tiny):
    """What a GPU worker's calibrate trains over (GGUF weights kept quantized, float16
    activations): the block trains in float32 and returns to float16, finite."""
    base = make_tiny(0)
    model = tiny_model(0)
    model.update(tree_map(lambda a: a.astype(mx.float16), model.parameters()))
    nn.quantize(model, group_size=32, bits=8)
    target = LoadedModel("tiny-0-q", model, base.tokenizer, 4096)
    # The float32 copy answers (float16 decoding is slow on a CPU); the features and the
    # teacher are the float16-quantized target's.
    train_p, held_p = split([base.encode_prompt(t) for t in WORKLOAD], 0.25, seed=0)
    train_f = features(target, answer(base, train_p, 20, samples=1), 2)
    held_f = features(target, answer(base, held_p, 20), 2)
    adapter = new_adapter(target.model, 2)
    cfg = TrainConfig(tokens=6000, eval_every=0, batch_tokens=512, seed=0)
    r = train(target.model, adapter, train_f, held_f, cfg)
    weights = adapter.trainable()
    assert all(mx.isfinite(v).all().item() for v in weights.values())
    assert {v.dtype for v in weights.values()} == {mx.float16}
    assert r.kl_after < 0.5 * r.kl_before and r.after >= r.before + 0.15, (r.before, r.after)


def test_an_untrained_adapter_is_early_exit_one_layer_later(make_tiny):
    """A copy of layer L over whole sequences = the target's layers [0, L]."""
    target = make_tiny(1)
    ids = mx.array([target.encode_prompt(WORKLOAD[0])])
    h2, _ = prefix_hidden(target.model, ids, 2)
    h3, _ = prefix_hidden(target.model, ids, 3)
    got = draft_hidden(new_adapter(target.model, 2), h2)
    assert np.allclose(np.array(got), np.array(h3), atol=1e-5)


def test_adapter_trains_only_its_own_weights(make_tiny):
    target = make_tiny(0)
    adapter = new_adapter(target.model, 2)
    names = set(adapter.trainable())
    assert "self_attn.q_proj.weight" in names and "mlp.down_proj.weight" in names
    # Its keys and values are the target's own layer-L entries: frozen.
    assert (
        not {"self_attn.k_proj.weight", "self_attn.v_proj.weight", "input_layernorm.weight"} & names
    )
    assert adapter.size() < target_size(target.model)


def test_a_quantized_target_counts_its_parameters_unpacked():
    """Shares of the target (the <= 5% rule, draft costs) count a quantized target's weights
    as parameters, not as the uint32 words that pack them."""
    model = tiny_model(0)  # its own copy: quantized below
    before = target_size(model)
    layer = weight_share(model, 2)
    nn.quantize(model, group_size=32, bits=4)
    assert isinstance(model.model.layers[0].mlp.up_proj, nn.QuantizedLinear)
    assert target_size(model) == before
    assert weight_share(model, 2) == pytest.approx(layer)


def test_adapter_layer_out_of_range_is_refused(make_tiny):
    target = make_tiny(0)
    for bad in (0, target.num_layers):
        with pytest.raises(ValueError, match="between 1 and 3"):
            new_adapter(target.model, bad)


def test_store_round_trip_and_the_best_is_chosen(make_tiny):
    target = make_tiny(0)
    a = new_adapter(target.model, 2)
    a.block.mlp.up_proj.weight = a.block.mlp.up_proj.weight * 1.5
    p_low = save(target, new_adapter(target.model, 2), {"agreement": 0.2})
    p_high = save(target, a, {"agreement": 0.6})
    save(target, new_adapter(target.model, 1), {"agreement": 0.9})
    assert p_low.parent == p_high.parent == adapters_dir() / model_key(target)
    got = load(p_high, target)
    assert got.layer == 2 and got.agreement == pytest.approx(0.6)
    assert mx.array_equal(got.block.mlp.up_proj.weight, a.block.mlp.up_proj.weight)
    assert [m["agreement"] for m, _ in stored(target, 2)] == [0.6, 0.2]
    assert best(target, 2).agreement == pytest.approx(0.6)
    assert best(target).layer == 1  # the best of any layer


def test_the_best_adapter_is_the_one_that_promises_the_most_speedup(make_tiny):
    """A deeper layer that agrees a little more costs more per draft token: the choice is
    the measured promise (agreement against draft and verify cost), not the agreement."""
    target = make_tiny(0)
    save(target, new_adapter(target.model, 1), {"agreement": 0.7})
    save(target, new_adapter(target.model, 2), {"agreement": 0.75})
    k1, s1 = promise(target, {"layer": 1, "agreement": 0.7})
    k2, s2 = promise(target, {"layer": 2, "agreement": 0.75})
    assert s1 > s2 > 1.0 and k1 >= k2 >= 1
    assert best(target).layer == 1
    # Where verifying costs what its width does (a compute-bound step), neither pays.
    assert promise(target, {"layer": 1, "agreement": 0.7}, lambda w: float(w)) == (0, 1.0)
    # Then the higher agreement decides.
    assert best(target, verify_cost=lambda w: float(w)).layer == 2
    assert promise(target, {"layer": 9, "agreement": 0.9}) == (0, 0.0)  # not this model's


def test_the_engine_prices_stored_adapters_on_its_surface(make_tiny):
    from core.engine.costs import BATCHES, WIDTHS

    target = make_tiny(0)
    save(target, new_adapter(target.model, 1), {"agreement": 0.7})
    save(target, new_adapter(target.model, 2), {"agreement": 0.75})
    flat = Engine(target, draft="adapter", surface=CostSurface.flat(), batch_size=1)
    assert flat.adapter.layer == 1  # width is free: the cheaper layer promises more
    # A compute-bound machine: a step costs what its tokens do, so no draft length pays.
    bound = CostSurface(BATCHES, WIDTHS, tuple(tuple(float(w) for w in WIDTHS) for _ in BATCHES))
    assert Engine(target, draft="adapter", surface=bound, batch_size=1).adapter.layer == 2


def test_best_length_against_the_formula():
    assert best_length(0.0, 0.1) == (0, 1.0)
    k, s = best_length(0.8, 0.1)
    assert k >= 2
    assert s == pytest.approx(max(expected_tokens(j, 0.8) / (1 + 0.1 * j) for j in range(1, 17)))
    assert best_length(0.8, 0.1, lambda w: 1 + 0.5 * (w - 1))[0] < k  # width costs: shorter


def test_corrupt_file_is_refused_with_a_clear_error(make_tiny):
    target = make_tiny(0)
    path = save(target, new_adapter(target.model, 2), {"agreement": 0.5})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(AdapterError, match="corrupt adapter file"):
        load(path, target)
    path.write_bytes(b"not a safetensors file at all")
    with pytest.raises(AdapterError, match="not a readable adapter file"):
        load(path, target)
    with pytest.raises(AdapterError, match="applespec calibrate"):
        best(target, 2)


def test_adapter_for_another_model_is_refused(make_tiny):
    mine, other = make_tiny(0), make_tiny(1)
    path = save(mine, new_adapter(mine.model, 2), {"agreement": 0.5})
    assert model_key(mine) != model_key(other)
    with pytest.raises(AdapterError, match="was made for model 'tiny-0'"):
        load(path, other)
    # Even when put where the other model's adapters live.
    folder = adapters_dir() / model_key(other)
    folder.mkdir(parents=True)
    shutil.copy(path, folder / path.name)
    with pytest.raises(AdapterError, match="was made for model"):
        load(folder / path.name, other)


def test_adapter_whose_weights_do_not_fit_is_refused(make_tiny):
    target = make_tiny(0)
    path = save(target, new_adapter(target.model, 2), {"agreement": 0.5})
    weights, meta = mx.load(str(path), return_metadata=True)
    weights["mlp.up_proj.weight"] = weights["mlp.up_proj.weight"][:, :8]
    mx.save_safetensors(str(path), weights, metadata=meta)
    with pytest.raises(AdapterError, match="has shape"):
        load(path, target)


def test_an_adapter_serves_and_learns_on_a_model_kept_quantized(make_tiny):
    """A GPU worker keeps GGUF weights quantized: an adapter trained on the float weights
    (same model key) loads there with its block in float, drafts with greedy output equal
    to plain greedy on the quantized target, and an untrained one starts there dequantized
    (online learning)."""
    import mlx.nn as nn

    from core.models.model import LoadedModel
    from core.models.tiny import tiny_model

    target = make_tiny(0)
    path = store_adapter(target, 2)
    kept = LoadedModel("tiny-0", tiny_model(0), target.tokenizer, 4096)  # its own copy
    for layer in kept.model.model.layers:  # the embeddings stay float
        nn.quantize(layer, group_size=32, bits=8)
    assert model_key(kept) == model_key(target)
    adapter = load(path, kept)
    assert not any(hasattr(m, "scales") for _, m in adapter.block.named_modules())
    fresh = new_adapter(kept.model, 2)
    src = kept.model.model.layers[2].self_attn.k_proj
    want = mx.dequantize(src.weight, src.scales, src.biases, src.group_size, src.bits)
    assert mx.array_equal(fresh.block.self_attn.k_proj.weight, want)
    prompts = [kept.encode_prompt(p) for p in ("the red car", "1, 2, 3, 1, 2, 3, 1,")]
    reqs = [(p, GenerationParams(max_tokens=24)) for p in prompts]
    plain = Engine(kept, draft="none", surface=FLAT, batch_size=2).generate_many(reqs)
    for spec in ("adapter:2", "auto"):
        eng = Engine(kept, draft=spec, k=3, surface=FLAT, batch_size=2, step_modes=False)
        assert [r.tokens for r in eng.generate_many(reqs)] == [r.tokens for r in plain]
    from core.training.online import OnlineLearner

    # Online learning trains through the quantized layers and head (gradients to the block).
    learner = OnlineLearner(kept.model, fresh, share=1.0, held_every=2, eval_every=2)
    for (p, _), r in zip(reqs, plain, strict=True):
        learner.observe(p, r.tokens)
    while learner.steps < 2:
        learner.work()
    held = learner.history[0]["held_out_positions"]  # one of the two prompts is held out
    assert held in (len(plain[0].tokens), len(plain[1].tokens))


def test_missing_adapter_names_calibrate_and_auto_falls_back(make_tiny, home):
    target = make_tiny(0)
    for spec in ("adapter", "adapter:2"):
        with pytest.raises(ValueError, match="applespec calibrate"):
            Engine(target, draft=spec, surface=FLAT, batch_size=2)
    path = save(target, new_adapter(target.model, 2), {"agreement": 0.5})
    path.write_bytes(b"garbage")  # a corrupt file: auto drafts without it
    eng = Engine(target, draft="auto", surface=FLAT, batch_size=2)
    assert eng.adapter is None
    prompt = target.encode_prompt(WORKLOAD[0])
    want = Engine(target, draft="none", surface=FLAT, batch_size=1).generate(
        prompt, GenerationParams(max_tokens=16)
    )
    assert eng.generate(prompt, GenerationParams(max_tokens=16)).tokens == want.tokens


def test_adapter_spec_must_name_a_layer_number():
    from core.engine import parse_draft_spec

    assert parse_draft_spec("adapter") == ("adapter", None)
    assert parse_draft_spec("adapter:6") == ("adapter", "6")
    with pytest.raises(ValueError, match="layer number"):
        parse_draft_spec("adapter:x")


def test_auto_uses_a_stored_adapter_and_stays_lossless(make_tiny):
    target = make_tiny(2)
    store_adapter(target, 2)
    eng = Engine(target, draft="auto", k=2, surface=FLAT, batch_size=2)
    assert eng.adapter is not None and eng.adapter.layer == 2
    batch = eng.new_batch()
    assert "adapter:2" in [d.name for d in batch.drafters]


def test_trained_adapter_drafts_what_its_training_measured(make_tiny):
    """The drafter's node logits (shared cache, one node at a time) match the whole-sequence
    training forward: a greedy row's first draft token is the adapter's argmax."""
    target = make_tiny(0)
    _, _, train_f, held_f = _data(target, 2)
    adapter = new_adapter(target.model, 2)
    train(target.model, adapter, train_f, held_f, TrainConfig(tokens=3000, eval_every=0))
    save(target, adapter, {"agreement": 0.5})
    prompt = target.encode_prompt(WORKLOAD[5])
    first = Engine(target, draft="none", surface=FLAT, batch_size=1).generate(
        prompt, GenerationParams(max_tokens=1)
    )
    ids = mx.array([prompt + first.tokens])
    h, _ = prefix_hidden(target.model, ids, 2)
    want = int(head(target.model, draft_hidden(adapter, h))[0, -1].argmax())
    eng = Engine(target, draft="adapter:2", k=1, surface=FLAT, batch_size=1, step_modes=False)
    batch = eng.new_batch()
    seq = batch.submit(prompt, GenerationParams(max_tokens=3))
    while not seq.output:
        batch.step()
    drafter = batch.drafters[0]
    got = drafter.propose([seq], [1]).tokens.tolist()[0][0]
    assert got == want


@pytest.mark.slow
def test_reduced_draft_vocabulary_round_trips_drafts_inside_it_and_stays_lossless(make_tiny):
    from core.training.data import top_tokens

    target = make_tiny(0)
    _, _, train_f, held_f = _data(target, 2)
    adapter = new_adapter(target.model, 2)
    train(target.model, adapter, train_f, held_f, TrainConfig(tokens=2000, eval_every=0))
    examples = answer(target, [target.encode_prompt(t) for t in WORKLOAD[:12]], 20)
    adapter.vocab = top_tokens(examples, 40, target.eos_token_ids)
    assert 1 < adapter.vocab.size <= 40
    assert set(target.eos_token_ids) <= set(adapter.vocab.tolist())
    reduced, _ = evaluate(target.model, adapter, held_f)
    path = save(target, adapter, {"agreement": reduced})
    got = load(path, target)
    assert got.vocab.tolist() == adapter.vocab.tolist()
    vocab = set(adapter.vocab.tolist())
    params = [
        GenerationParams(max_tokens=24),
        GenerationParams(max_tokens=24, temperature=0.9, seed=4),
    ]
    prompts = [target.encode_prompt(t) for t in WORKLOAD[30:33]]
    reqs = [(p, q) for p in prompts for q in params]
    plain = Engine(target, draft="none", surface=FLAT, batch_size=1)
    want = [plain.generate(p, q).tokens for p, q in reqs]
    eng = Engine(target, draft="adapter:2", k=3, surface=FLAT, batch_size=3, step_modes=False)
    assert [r.tokens for r in eng.generate_many(reqs)] == want
    batch = eng.new_batch()
    seq = batch.submit(prompts[0], params[1])
    while not seq.output:
        batch.step()
    drafted = batch.drafters[0].propose([seq], [4]).tokens.tolist()[0]
    assert set(drafted) <= vocab


def test_corrupt_draft_vocabulary_is_refused(make_tiny):
    target = make_tiny(0)
    adapter = new_adapter(target.model, 2)
    adapter.vocab = mx.array([1, 2, 5000], dtype=mx.int32)  # past the 259 tokens
    path = save(target, adapter, {"agreement": 0.5})
    with pytest.raises(AdapterError, match="draft vocabulary outside"):
        load(path, target)
