"""Online learning of the self-drafter (core/training/online.py: an early-exit adapter or the
feature head) on tiny float32 models: output stays plain greedy while versions are swapped
in, later rows of a repetitive job accept more than its first rows, a worse version is never
swapped in, and learning keeps to its share of the time."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_map, tree_unflatten

from core.engine import CostSurface, Engine, GenerationParams
from core.engine.adapters import AdapterError, new_adapter
from core.engine.adapters.head import new_head_adapter
from core.engine.resident import ResidentLoop
from core.models import LoadedModel
from core.models.tiny import tiny_model
from core.training.online import OnlineLearner, learner_factory

FLAT = CostSurface.flat()
WORDS = ["red", "blue", "green", "big", "small", "old", "new", "fast"]
THINGS = ["car", "cat", "cup", "tree", "road", "book", "lamp", "door"]
JOB = [f"Label {i}: the {WORDS[i % 8]} {THINGS[(i * 3) % 8]}, number {i}." for i in range(48)]


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))  # nothing stored: starts untrained
    return tmp_path


def _acceptance(results) -> float:
    drafted = sum(r.speculative["draft_tokens"] for r in results)
    return sum(r.speculative["accepted_tokens"] for r in results) / max(drafted, 1)


# A drafter spec, and the untrained self-drafter it starts from when none is stored.
UNTRAINED = {"adapter:1": lambda m: new_adapter(m, 1), "head": new_head_adapter}


@pytest.mark.slow
@pytest.mark.parametrize("draft", [*UNTRAINED, "head-resident"])
@pytest.mark.parametrize("weights", ["float32", "float16-quantized"])
def test_a_job_learns_its_drafter_while_output_stays_plain_greedy(weights, draft, make_tiny):
    """`float16-quantized` is what a GPU worker runs (GGUF weights kept quantized, float16
    activations): the block trains in float32 there, or Adam learns nothing. `head`: a
    feature head, untrained when the job starts (nothing stored), learns from the job;
    `head-resident` drafts in the resident loop (one token a row) while it learns."""
    target = make_tiny(3)
    if weights != "float32":
        model = tiny_model(3)
        model.update(tree_map(lambda a: a.astype(mx.float16), model.parameters()))
        nn.quantize(model, group_size=32, bits=8)
        target = LoadedModel("tiny-3", model, target.tokenizer, 4096)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=24)) for p in JOB]
    plain = Engine(target, draft="none", surface=FLAT, batch_size=4).generate_many(reqs)
    resident = draft == "head-resident"
    draft = draft.removesuffix("-resident")
    eng = Engine(
        target,
        draft=draft,
        k=3,
        surface=FLAT,
        batch_size=4,
        step_modes=False,
        learner=learner_factory(1.0),
        resident=resident,
    )
    assert eng.adapter.kind == ("feature-head" if draft == "head" else "early-exit")
    done = []
    got = eng.generate_many(reqs, on_result=done.append)
    assert [r.tokens for r in got] == [r.tokens for r in plain]
    learner = eng.learner
    assert learner.version >= 1 and learner.history
    assert all(h["serving"] >= h["was_serving"] for h in learner.history)
    versions = [r.speculative["adapter_version"] for r in done]  # in the order rows finished
    assert versions == sorted(versions) and versions[0] == 0 and versions[-1] == learner.version
    first, last = _acceptance(done[:12]), _acceptance(done[-12:])
    assert last > first + 0.1, (first, last)


@pytest.mark.parametrize("draft", list(UNTRAINED))
def test_a_worse_version_is_never_swapped_in(make_tiny, draft):
    target = make_tiny(3)
    eng = Engine(target, draft="none", surface=FLAT, batch_size=4)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=24)) for p in JOB[:20]]
    untrained = UNTRAINED[draft](target.model)
    learner = OnlineLearner(target.model, untrained, share=1.0, eval_every=4)
    for (p, _), r in zip(reqs, eng.generate_many(reqs), strict=True):
        learner.observe(p, r.tokens)
    while learner.work() and learner.version == 0:
        pass
    assert learner.version == 1
    before = {k: np.array(v) for k, v in tree_flatten(learner.serving.block.parameters())}
    # A candidate made worse than what serves: noise over its trained weights.
    noisy = {
        k: v + 3.0 * mx.random.normal(v.shape, key=mx.random.key(1))
        for k, v in tree_flatten(learner.candidate.block.trainable_parameters())
    }
    learner.candidate.block.update(tree_unflatten(noisy))
    entry = learner.evaluate()
    assert not entry["swapped"] and entry["candidate"] < entry["was_serving"]
    assert learner.version == 1
    after = dict(tree_flatten(learner.serving.block.parameters()))
    assert all(np.array_equal(before[k], np.array(after[k])) for k in before)


@pytest.mark.slow
def test_padded_shapes_learn_what_exact_ones_do_and_meet_few_shapes(make_tiny, monkeypatch):
    """On CUDA (`kv_pad` 64) the learner rounds its shapes up: attention graphs are built
    per exact shape there. Padding must change nothing but the shapes: the same steps give
    the same weights and agreements, over a handful of (B, T) instead of one per step."""
    target = make_tiny(3)
    eng = Engine(target, draft="none", surface=FLAT, batch_size=4)
    reqs = [  # rows of many lengths, as a real job's
        (target.encode_prompt(p + " again" * (i % 5)), GenerationParams(max_tokens=8 + i % 17))
        for i, p in enumerate(JOB[:30])
    ]
    rows = [(p, r.tokens) for (p, _), r in zip(reqs, eng.generate_many(reqs), strict=True)]
    learners = {}
    for pad in ("0", "64"):
        monkeypatch.setenv("APPLESPEC_KV_PAD", pad)
        lr = OnlineLearner(target.model, new_adapter(target.model, 1), share=1.0, eval_every=5)
        shapes = set()
        hidden = lr._hidden
        lr._hidden = lambda a, x, idx, t, h=hidden, s=shapes: (s.add(x.shape), h(a, x, idx, t))[1]
        for i, (p, a) in enumerate(rows):  # rows arrive a few at a time, as they finish
            lr.observe(p, a)
            if i % 3 == 2:
                for _ in range(3):
                    lr.work()
        while lr.steps < 30 and lr.work():
            pass
        learners[pad] = (lr, shapes)
    (exact, exact_shapes), (padded, padded_shapes) = learners["0"], learners["64"]
    assert padded.pad == 64 and exact.pad == 0
    assert padded.steps == exact.steps and padded.trained == exact.trained
    assert all(T % 64 == 0 and B & (B - 1) == 0 for B, T, _ in padded_shapes)
    # Rows grow to a power of two as the buffer fills: a few sizes, against one per step.
    assert 2 * len(padded_shapes) <= len(exact_shapes), (padded_shapes, exact_shapes)
    want = dict(tree_flatten(exact.candidate.block.parameters()))
    for k, v in tree_flatten(padded.candidate.block.parameters()):
        assert np.allclose(np.array(v), np.array(want[k]), atol=1e-4), k
    held = list(exact._held)
    assert padded.agreement(padded.candidate, held) == exact.agreement(exact.candidate, held)
    assert [h["candidate"] for h in padded.history] == [h["candidate"] for h in exact.history]


def test_learning_keeps_to_its_share_of_the_wall_time(make_tiny):
    target = make_tiny(3)
    now = [0.0]
    learner = OnlineLearner(target.model, new_adapter(target.model, 1), share=0.1)
    learner.clock = lambda: now[0]
    assert not learner.tick()  # nothing observed yet
    learner.observe(target.encode_prompt(JOB[0]), [5, 6, 7, 8])
    learner.observe(target.encode_prompt(JOB[1]), [5, 6, 9])

    def work():  # each unit of work takes 5 s on this clock
        now[0] += 5.0
        return True

    learner.work = work
    now[0] = 10.0
    assert learner.tick() and learner.spent == 5.0  # 0 spent of a 1 s budget: one unit
    now[0] = 20.0
    assert not learner.tick()  # 5 s spent > 10% of 20 s
    now[0] = 50.0
    assert learner.tick()  # 5 s <= 10% of 50 s
    assert learner.spent == 10.0


def test_bad_learning_settings_are_refused(make_tiny):
    target = make_tiny(3)
    with pytest.raises(ValueError, match="learning share"):
        learner_factory(1.5)
    with pytest.raises(ValueError, match="learning share"):
        OnlineLearner(target.model, new_adapter(target.model, 1), share=0)
    # Without a layer there is nothing to start from: the calibrate hint, as without learning.
    with pytest.raises(AdapterError, match="applespec calibrate"):
        Engine(target, draft="adapter", surface=FLAT, learner=learner_factory(0.1))
    with pytest.raises(AdapterError, match="applespec calibrate"):
        Engine(target, draft="adapter:1", surface=FLAT)  # no learning: a stored one is needed
    with pytest.raises(AdapterError, match="applespec calibrate"):
        Engine(target, draft="head", surface=FLAT)


@pytest.mark.parametrize("resident", [False, True])
def test_a_learning_head_takes_its_pairs_from_the_verify_steps(make_tiny, monkeypatch, resident):
    """The feature head's drafter keeps the states the engine's steps computed for it; its
    learner trains on those pairs without a forward over the finished rows, and they are
    the states such a forward gives. So in the resident loop (core/engine/resident.py),
    which the engine leaves and enters again as rows join."""
    from core.training import online

    target = make_tiny(3)
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=6 + 3 * i))
        for i, p in enumerate(JOB[:10])
    ]
    forwards = []
    real = online.prefix_hidden
    monkeypatch.setattr(online, "prefix_hidden", lambda *a: (forwards.append(1), real(*a))[1])
    eng = Engine(
        target,
        draft="head",
        k=2,
        surface=FLAT,
        batch_size=4,
        step_modes=False,
        learner=learner_factory(1.0),
        resident=resident,
    )
    loops = []
    launch = ResidentLoop.launch
    monkeypatch.setattr(ResidentLoop, "launch", lambda self: (loops.append(1), launch(self))[1])
    got = eng.generate_many(reqs)
    assert (len(loops) > 10) == resident
    lr = eng.learner
    while lr._new:
        lr._featurize()
    assert forwards == [] and lr.rows == len(reqs)
    ref = OnlineLearner(target.model, new_head_adapter(target.model))
    for (p, _), r in zip(reqs, got, strict=True):
        ref.observe(p, r.tokens)  # no states: a forward computes them
    while ref._new:
        ref._featurize()
    assert forwards

    def pairs(learner):
        samples = list(learner._train) + list(learner._held)
        return {(tuple(s.tokens.tolist()), tuple(s.targets.tolist())): s.exit for s in samples}

    mine, theirs = pairs(lr), pairs(ref)
    assert len(mine) >= 8 and mine.keys() == theirs.keys()
    for key, x in mine.items():
        assert x.shape == theirs[key].shape and mx.allclose(x, theirs[key], atol=1e-4).item(), key
