"""Speculative decoding in a batch is lossless: every row's greedy output equals plain greedy
decoding of that row alone, for every drafter, whatever shares the batch; seeded sampling
equals plain seeded sampling token for token, and follows the target distribution."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.generate import generate_step

from core.engine import CostSurface, Engine, GenerationParams
from core.engine.cache import LANE_FROM
from core.engine.memory import RequestTooLarge, bytes_per_position, kv_bytes, row_positions
from core.models import LoadedModel
from core.training.online import learner_factory
from tests.engine.conftest import SMALL_VOCAB, store_adapter, store_head

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Label: positive. Text: I loved it. Label: negative. Text: awful. Label:",
    "def add(a, b):\n    return a + b\n\ndef add(",
    "1, 2, 3, 1, 2, 3, 1, 2,",
    "Copy: the red car. Again: the red",
]
DRAFTERS = [
    "ngram",
    "suffix",
    "tree",
    "early-exit:1",
    "early-exit:3",
    "auto",
    "draft-model:same",
    "draft-model:other",
    "adapter:1",
    "adapter:3",
    "adapter",
    "head",
    "head:3",
]
FLAT = CostSurface.flat()
TIE = 1e-3  # a tiny model's top-two logit gap below which GPU rounding may pick either


@pytest.fixture(autouse=True)
def _adapters(adapter_home, monkeypatch):
    """Trained adapters live in one session data directory (`auto` uses them too)."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))


def engine(target, drafter, make_tiny, k=None, batch=4, **kw):
    if drafter.startswith("adapter") or drafter == "auto":
        for layer in (1, target.num_layers - 1):  # L + 1 = the last layer: forward's head
            store_adapter(target, layer)
    if drafter.startswith("head"):
        store_head(target)
    if drafter.startswith("draft-model"):
        kw["draft_model"] = target if drafter.endswith("same") else make_tiny(99)
        kw.setdefault("draft_cost", 0.1)
    if drafter == "auto":
        kw.setdefault("draft_model", make_tiny(99))
        kw.setdefault("draft_cost", 0.1)
    return Engine(target, draft=drafter, k=k, surface=FLAT, batch_size=batch, **kw)


def plain(target, prompt, params):
    """Plain decoding of one row alone, through our engine at batch 1."""
    return Engine(target, draft="none", surface=FLAT, batch_size=1).generate(prompt, params).tokens


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("drafter", DRAFTERS)
@pytest.mark.slow
def test_batched_speculative_greedy_equals_each_row_alone(seed, drafter, make_tiny):
    """Ragged prompts, rows finishing at different times (max_tokens 12..48), rows joining
    mid-run (5 requests, 3 rows), adaptive and fixed k."""
    target = make_tiny(seed, tie_word_embeddings=seed % 2 == 0)
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=12 + 9 * i))
        for i, p in enumerate(PROMPTS)
    ]
    want = [plain(target, p, params) for p, params in reqs]
    for k in (None, 1 + seed % 4):
        got = engine(target, drafter, make_tiny, k=k, batch=3).generate_many(reqs)
        if [r.tokens for r in got] == want:
            continue
        gaps = _first_gaps(target, reqs, want, got)
        # On this CPU float32 results do not depend on batch shape: token for token. On a GPU
        # (MLX's CUDA backend) they do, at rounding level: a row may only leave plain greedy
        # where the reference's top two logits tie to within TIE (H200: 0.0003 seen).
        assert mx.default_device() != mx.cpu, (drafter, k, gaps)
        assert all(gap < TIE for _, gap in gaps), (drafter, k, gaps)


def _first_gaps(target, reqs, want, got) -> list:
    """Per differing row: where it first differs and the reference's top-1 minus top-2 logit
    there (a failure's evidence: a tie in the tiny random model, or a bug)."""
    from core.benchmark import first_difference, top_gap

    out = []
    for (prompt, _), w, g in zip(reqs, want, got, strict=True):
        if g.tokens != w:
            j = first_difference(g.tokens, w)
            out.append((j, round(top_gap(target, prompt, w[:j]), 6)))
    return out


def test_plain_greedy_equals_mlx_lm(make_tiny):
    target = make_tiny(1)
    for text in PROMPTS[:2]:
        prompt = target.encode_prompt(text)
        ours = plain(target, prompt, GenerationParams(max_tokens=40))
        theirs = [int(t) for t, _ in generate_step(mx.array(prompt), target.model, max_tokens=40)]
        # mlx-lm does not stop at EOS inside generate_step; compare up to our stop point.
        assert ours == theirs[: len(ours)]
        assert len(ours) == 40 or theirs[len(ours)] in target.eos_token_ids


@pytest.mark.parametrize("pipeline", [True, False])
def test_plain_batch_equals_rows_alone(pipeline, make_tiny):
    target = make_tiny(2)
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=5 + 7 * i))
        for i, p in enumerate(PROMPTS)
    ]
    want = [plain(target, p, params) for p, params in reqs]
    eng = Engine(target, draft="none", surface=FLAT, batch_size=2, pipeline=pipeline)
    assert [r.tokens for r in eng.generate_many(reqs)] == want


@pytest.mark.parametrize("drafter", ["none", *DRAFTERS])
def test_seeded_sampling_is_the_plain_sample_in_any_batch(drafter, make_tiny):
    """Sampled rows (temperature, top-p, top-k, seeds) and greedy rows mixed in one batch:
    each row equals plain seeded sampling of that row alone, token for token."""
    target = make_tiny(3)
    params = [
        GenerationParams(max_tokens=30, temperature=0.8, top_p=0.9, seed=7),
        GenerationParams(max_tokens=30),
        GenerationParams(max_tokens=25, temperature=1.3, top_k=5, seed=11),
        GenerationParams(max_tokens=20, temperature=0.6, seed=7),
    ]
    reqs = [(target.encode_prompt(p), q) for p, q in zip(PROMPTS, params, strict=False)]
    want = [plain(target, p, q) for p, q in reqs]
    got = engine(target, drafter, make_tiny, batch=3).generate_many(reqs)
    assert [r.tokens for r in got] == want


def test_unseeded_rows_differ_between_runs(make_tiny):
    target = make_tiny(3)
    prompt = target.encode_prompt(PROMPTS[0])
    params = GenerationParams(max_tokens=24, temperature=1.0)
    runs = {tuple(plain(target, prompt, params)) for _ in range(4)}
    assert len(runs) > 1


def _exact_two_tokens(model, prompt, V):
    """p(t1, t2 | prompt) of a model by enumeration (plain mlx-lm forwards)."""
    exact = np.zeros((V, V))
    p1 = mx.softmax(model(mx.array([prompt]))[0, -1]).tolist()
    for a in range(V):
        p2 = mx.softmax(model(mx.array([prompt + [a]]))[0, -1]).tolist()
        exact[a] = np.array(p1[a]) * np.array(p2)
    return exact


@pytest.mark.parametrize(
    "drafter",
    [
        "none",
        "ngram",
        "early-exit:2",
        "draft-model:noisy",
        "tree",
        "adapter:1",
        "adapter:2",
        "adapter:1+learn",
        "head",
        "head:3",
    ],
)
@pytest.mark.slow
def test_sampled_rows_of_a_batch_follow_the_target_distribution(drafter, small_vocab):
    """Three rows with different prompts share each batch; per row, the joint distribution
    of its first two tokens over 600 seeds matches the exact target distribution
    (chi-square bound mean + 5 sd: false alarms < 1e-5). `+learn`: the adapter learns
    online from those rows meanwhile, its new versions swapped in between steps."""
    from tests.engine.test_acceptance import chi_square_ok

    V = SMALL_VOCAB
    target = small_vocab(5)
    extra = {}
    if drafter == "draft-model:noisy":
        extra = {
            "draft_model": small_vocab(6, "d"),
            "draft_cost": 0.1,
        }
    prompts = [[1, 2, 3, 4], [5, 0, 1], [2, 2, 2, 2, 2]]
    if drafter.endswith("+learn"):
        drafter = drafter.removesuffix("+learn")
        extra = {
            "learner": learner_factory(1.0)
        }  # a unit of learning every step: the same swaps on any machine
    if drafter.startswith("adapter"):
        store_adapter(target, int(drafter.split(":")[1]), prompts=[[0, 1, 2], [3, 4, 5, 1]])
    if drafter.startswith("head"):
        store_head(target, prompts=[[0, 1, 2], [3, 4, 5, 1]])
    exact = [_exact_two_tokens(target.model, p, V) for p in prompts]
    eng = Engine(target, draft=drafter, k=3, surface=FLAT, batch_size=3, **extra)
    if eng.learner is not None:
        eng.learner.held_every = 2  # three prompts: hold one out, so versions are compared
    runs = 600
    counts = [np.zeros((V, V)) for _ in prompts]
    for s in range(runs):
        reqs = [
            (p, GenerationParams(max_tokens=2, temperature=1.0, seed=s * 3 + i))
            for i, p in enumerate(prompts)
        ]
        for i, r in enumerate(eng.generate_many(reqs)):
            counts[i][r.tokens[0], r.tokens[1]] += 1  # vocab 6 has no EOS: always two tokens
    for i in range(len(prompts)):
        stat, bound = chi_square_ok(counts[i].ravel(), exact[i].ravel(), runs)
        assert stat < bound, (drafter, i, stat, bound)
    if "learner" in extra:
        assert eng.learner.version >= 1  # a version was swapped in meanwhile


def test_metrics_are_consistent(make_tiny):
    target = make_tiny(2)
    prompt = target.encode_prompt(PROMPTS[2] * 3)
    r = Engine(target, draft="ngram", k=4, surface=FLAT, batch_size=2).generate(
        prompt, GenerationParams(max_tokens=64)
    )
    s, t = r.speculative, r.timing
    assert s["drafter"] == "ngram"
    assert s["accepted_tokens"] <= s["draft_tokens"]
    assert sum(s["accepted_per_position"]) == s["accepted_tokens"]
    assert s["accepted_per_position"] == sorted(s["accepted_per_position"], reverse=True)
    # every step emits its accepted tokens plus one; the first token comes from the prefill
    assert s["accepted_tokens"] + s["verify_steps"] >= len(r.tokens) - 1
    assert s["mean_accepted_length"] > 1.0  # a prompt repeated three times: copies pay
    for key in ("ttft_s", "draft_s", "verify_s", "accept_s", "cache_s", "total_s"):
        assert t[key] >= 0.0
    assert t["total_s"] >= t["ttft_s"]
    assert t["batch_size"] == 1.0


def test_batch_size_is_reported_per_item(make_tiny):
    target = make_tiny(2)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=20)) for p in PROMPTS[:4]]
    res = Engine(target, draft="ngram", surface=FLAT, batch_size=4).generate_many(reqs)
    assert all(1.0 < r.timing["batch_size"] <= 4.0 for r in res)


def test_eos_stops_and_is_not_returned(make_tiny):
    target = make_tiny(0)
    prompt = target.encode_prompt(PROMPTS[0])
    first = plain(target, prompt, GenerationParams(max_tokens=1))[0]
    eos_target = LoadedModel(target.name, target.model, target.tokenizer, 4096)
    eos_target.tokenizer = type(
        "T",
        (),
        {"eos_token_ids": {first}, "decode": target.decode, "encode": target.tokenizer.encode},
    )()
    for d in ("none", "ngram", "early-exit:2"):
        r = Engine(eos_target, draft=d, surface=FLAT, batch_size=2).generate(
            prompt, GenerationParams(8)
        )
        assert r.tokens == [] and r.finish_reason == "stop"


def test_a_long_prompt_is_prefilled_in_chunks_beside_decoding_rows(make_tiny):
    target = make_tiny(4)
    long = target.encode_prompt(PROMPTS[1] * 12)  # ~800 tokens: several 64-token chunks
    reqs = [
        (target.encode_prompt(PROMPTS[0]), GenerationParams(max_tokens=30)),
        (long, GenerationParams(max_tokens=10)),
    ]
    want = [plain(target, p, q) for p, q in reqs]
    eng = Engine(target, draft="ngram", surface=FLAT, batch_size=2, prefill_tokens=64)
    assert [r.tokens for r in eng.generate_many(reqs)] == want


def test_kv_budget_admits_rows_one_by_one(make_tiny):
    target = make_tiny(4)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=10)) for p in PROMPTS[:3]]
    want = [plain(target, p, q) for p, q in reqs]
    per = bytes_per_position(target.model)
    one = max(kv_bytes([row_positions(len(p), 10)], LANE_FROM, per) for p, _ in reqs)
    eng = Engine(target, draft="ngram", surface=FLAT, batch_size=3, max_kv_bytes=one)
    res = eng.generate_many(reqs)
    assert [r.tokens for r in res] == want
    assert all(r.timing["batch_size"] == 1.0 for r in res)  # one row at a time


def test_a_request_that_cannot_fit_alone_fails_before_it_runs(make_tiny):
    target = make_tiny(4)
    prompt = target.encode_prompt(PROMPTS[0])
    per = bytes_per_position(target.model)
    eng = Engine(target, draft="none", surface=FLAT, batch_size=2, max_kv_bytes=200 * per)
    batch = eng.new_batch()
    batch.submit(prompt, GenerationParams(max_tokens=8), tag="fits")
    with pytest.raises(RequestTooLarge, match="KV cache"):
        batch.submit(prompt, GenerationParams(max_tokens=500), tag="too large")
    assert [r.tag for r in batch.run()] == ["fits"]


@pytest.mark.parametrize(
    "drafter,pad",
    [(d, "0") for d in ("none", "ngram", "tree", "early-exit:1", "head:3", "auto")]
    + [(d, "8") for d in ("none", "ngram", "head:3")],
)
@pytest.mark.slow
def test_long_rows_in_lanes_beside_short_rows_stay_lossless(drafter, pad, make_tiny, monkeypatch):
    """Rows past `lane_from` positions keep their cache in lanes of their own (grown chunk by
    chunk while prefilling) beside the dense block's short rows, joining and leaving: each
    row equals itself alone; with padded reads (the CUDA layout, `pad` 8) too."""
    monkeypatch.setenv("APPLESPEC_KV_PAD", pad)
    target = make_tiny(5)
    long = [target.encode_prompt(PROMPTS[i] * (6 + 3 * i)) for i in (1, 2)]  # 300-800 tokens
    reqs = [
        (long[0], GenerationParams(max_tokens=60)),
        (target.encode_prompt(PROMPTS[0]), GenerationParams(max_tokens=30)),
        (long[1], GenerationParams(max_tokens=20)),
        (target.encode_prompt(PROMPTS[3]), GenerationParams(max_tokens=16)),
        (long[0], GenerationParams(max_tokens=14)),  # shares the first's prefix: copied
    ]
    monkeypatch.setenv("APPLESPEC_KV_PAD", "0")
    want = [plain(target, p, q) for p, q in reqs]
    monkeypatch.setenv("APPLESPEC_KV_PAD", pad)
    eng = engine(target, drafter, make_tiny, batch=3, lane_from=100, prefill_tokens=64)
    batch = eng.new_batch()
    lanes_seen = []
    for i, (p, q) in enumerate(reqs):
        batch.submit(p, q, tag=i)
    got = {}
    while not batch.idle:
        for r in batch.step():
            got[r.tag] = r.tokens
        lanes_seen.append(len(batch.cache.lanes))
    assert [got[i] for i in range(len(reqs))] == want
    assert max(lanes_seen) >= 2 and lanes_seen[-1] == 0  # lanes made, and freed at the end


def test_an_isolated_request_runs_alone(make_tiny):
    target = make_tiny(4)
    eng = Engine(target, draft="ngram", surface=FLAT, batch_size=3)
    batch = eng.new_batch()
    p = [target.encode_prompt(t) for t in PROMPTS[:3]]
    batch.submit(p[0], GenerationParams(max_tokens=8), tag=0)
    batch.submit(p[1], GenerationParams(max_tokens=8), tag=1, isolate=True)
    batch.submit(p[2], GenerationParams(max_tokens=8), tag=2)
    res = {r.tag: r for r in batch.run()}
    assert res[1].timing["batch_size"] == 1.0
    assert [res[i].tokens for i in range(3)] == [
        plain(target, q, GenerationParams(max_tokens=8)) for q in p
    ]


def test_early_exit_adds_no_weights(make_tiny):
    target = make_tiny(4)
    n_params = sum(v.size for v in _leaves(target.model))
    r = engine(target, "early-exit:2", make_tiny, k=3).generate(
        target.encode_prompt(PROMPTS[0]), GenerationParams(max_tokens=20)
    )
    assert len(r.tokens) == 20
    assert sum(v.size for v in _leaves(target.model)) == n_params


def _leaves(m):
    from mlx.utils import tree_flatten

    return [v for _, v in tree_flatten(m.parameters())]


@pytest.mark.parametrize(
    "spec",
    [
        "bogus",
        "early-exit",
        "early-exit:x",
        "early-exit:0",
        "early-exit:99",
        "ngram:3",
        "tree:3,2",
        "head:0",
        "head:x",
    ],
)
def test_bad_drafter_spec(spec, make_tiny):
    with pytest.raises(ValueError, match="drafter|layer|width"):
        Engine(make_tiny(0), draft=spec)


def test_prompt_longer_than_context(make_tiny):
    t = make_tiny(0)
    short = LoadedModel(t.name, t.model, t.tokenizer, context_length=8)
    with pytest.raises(ValueError, match="context"):
        Engine(short, draft="none", surface=FLAT).generate(list(range(10)), GenerationParams())


def test_an_unknown_model_family_is_refused(make_tiny):
    t = make_tiny(0)
    t.model.args.model_type = "gpt_neox"
    try:
        with pytest.raises(ValueError, match="gpt_neox"):
            Engine(t, draft="none", surface=FLAT)
    finally:
        t.model.args.model_type = "llama"


@pytest.mark.parametrize("batch", [3, 5])
def test_rows_sharing_a_prompt_prefix_copy_it_and_generate_the_same(make_tiny, batch):
    """Prompts sharing a template: joining rows copy the prefix another row holds (in the
    first wave too: they wait a step for it, then copy it together) instead of computing it;
    outputs are unchanged."""
    target = make_tiny(6)
    template = "You label reviews as positive or negative, one word. Review: "
    texts = [
        template + t for t in ("great phone", "awful screen", "fine", "broke in a day", "love it")
    ]
    reqs = [(target.encode_prompt(t), GenerationParams(max_tokens=12)) for t in texts]
    want = [plain(target, p, q) for p, q in reqs]
    shared = Engine(target, draft="ngram", surface=FLAT, batch_size=batch).generate_many(reqs)
    assert [r.tokens for r in shared] == want
    copied = [r.timing["shared_prefix_tokens"] for r in shared]
    assert (
        sum(c > 0 for c in copied) >= 3 and max(copied) >= len(target.encode_prompt(template)) - 1
    )
    alone = Engine(target, draft="ngram", surface=FLAT, batch_size=batch, share_prefixes=False)
    assert all(r.timing["shared_prefix_tokens"] == 0 for r in alone.generate_many(reqs))


@pytest.mark.parametrize("head", [4, 256])
def test_the_shared_prefix_found_for_all_rows_at_once_is_the_one_row_by_row(make_tiny, head):
    """The donor and length `Prefill.shared` finds comparing every row's prompt head at once are
    those of comparing row by row (prompts longer than the head, shorter rows, ties, rows
    holding less than they share, slots reused by other rows)."""
    from types import SimpleNamespace

    from core.engine.prefill import common

    rng = np.random.default_rng(3)
    batch = Engine(make_tiny(0), draft="none", surface=FLAT, prompt_head=head).new_batch(6)

    def one_by_one(s):
        best, donor = 0, None
        for o in batch.rows:
            if o is not None and o is not s:
                n = common(s, o, o.have)
                if n > best:
                    best, donor = n, o
        return (best, donor) if best >= batch.config.min_shared_prefix else (0, None)

    stems = [list(rng.integers(0, 50, 40)) for _ in range(3)]
    found = 0
    for _ in range(60):
        for slot in range(6):  # every round puts other rows in some slots
            if rng.random() < 0.5 or batch.rows[slot] is None:
                stem = stems[rng.integers(3)][: rng.integers(0, 40)]
                prompt = stem + list(rng.integers(0, 50, rng.integers(1, 12)))
                have = int(rng.integers(0, len(prompt) + 1))
                batch.rows[slot] = SimpleNamespace(prompt=prompt, slot=slot, have=have)
                batch.prefill.write_head(batch.rows[slot])
        s = batch.rows[int(rng.integers(6))]
        want = one_by_one(s)
        assert batch.prefill.shared(s, lambda o: o.have) == want
        found += want[1] is not None
    assert found > 20


@pytest.mark.parametrize("drafter", ["none", "ngram", "tree", "auto", "head:3"])
def test_cuda_shapes_change_nothing(drafter, make_tiny, monkeypatch):
    """With padded reads (the CUDA layout, forced here) every slot verifies in one segment of
    a fixed query count, empty slots with a dummy token: each row still equals itself alone."""
    monkeypatch.setenv("APPLESPEC_KV_PAD", "8")
    target = make_tiny(7)
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=10 + 6 * i))
        for i, p in enumerate(PROMPTS)
    ]
    monkeypatch.setenv("APPLESPEC_KV_PAD", "0")
    want = [plain(target, p, q) for p, q in reqs]
    monkeypatch.setenv("APPLESPEC_KV_PAD", "8")
    got = engine(target, drafter, make_tiny, batch=4).generate_many(reqs)
    assert [r.tokens for r in got] == want


@pytest.mark.slow
def test_prefill_peak_memory_grows_with_the_prompt_by_little_more_than_its_kv(tokenizer):
    """Peak memory of prefilling 1k, 4k and 16k tokens (plus two generated) in a batch of
    8 slots: beyond 4k it grows by the row's KV and the chunk's mask per position, not by a
    chunk x context score tensor or every slot's cache."""
    from core.engine import cpu_math
    from core.models.tiny import tiny_model

    target = LoadedModel("tiny-long", tiny_model(3), tokenizer, 1 << 15)
    per = bytes_per_position(target.model)
    mx.eval(target.model.parameters())
    peaks = {}
    for n in (1024, 4096, 16384):
        eng = Engine(target, draft="none", surface=FLAT, batch_size=8, prefill_tokens=1024)
        prompt = np.random.default_rng(n).integers(0, 256, n).tolist()
        mx.clear_cache()
        mx.reset_peak_memory()
        base = mx.get_active_memory()
        eng.generate_many([(prompt, GenerationParams(max_tokens=2))], capacity=8)
        peaks[n] = mx.get_peak_memory() - base
    slope = (peaks[16384] - peaks[4096]) / (16384 - 4096)
    assert slope <= 4 * per + 8 * 1024, (peaks, per)  # KV (grown by half) + bool/float mask
    scores = cpu_math.SCORE_BYTES if mx.default_device() == mx.cpu else 0
    assert peaks[16384] <= 2 * 16384 * per + 20 * scores + 64 * 2**20, peaks
