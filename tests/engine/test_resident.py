"""The feature head's resident loop (core/engine/resident.py) is lossless: every row's greedy
output equals plain greedy decoding of that row alone and every sampled row's plain seeded
sampling's, with rows joining (the loop left and entered again), finishing at max_tokens, at
EOS and at a stop string a step before the host reads it, beside plain steps (step modes)
and with CUDA's padded all-slot layout."""

from collections import Counter

import mlx.core as mx
import pytest

from core.engine import Batch, CostSurface, Engine, GenerationParams
from core.engine.config import ModeTuning
from core.models import LoadedModel
from tests.engine.conftest import store_head
from tests.engine.test_adapters import WORKLOAD

FLAT = CostSurface.flat()
# Each token a row as dear as a plain step (a compute-bound machine): no chain pays.
DEAR = CostSurface(
    FLAT.batches, FLAT.widths, tuple(tuple(float(w) for w in FLAT.widths) for _ in FLAT.batches)
)


def _plain(target, reqs):
    eng = Engine(target, draft="none", surface=FLAT, batch_size=1)
    return [eng.generate(p, q).tokens for p, q in reqs]


def _through(batch: Batch, reqs) -> list:
    """The requests through `batch`; results in request order."""
    for i, (p, q) in enumerate(reqs):
        batch.submit(p, q, tag=i)
    return sorted(batch.run(), key=lambda r: r.tag)


def _priced(eng, ms: float) -> Engine:
    """The engine with its head's drafting depth costing `ms` milliseconds at every row
    count (as if timed; FLAT prices every verify forward at 1 ms)."""
    eng.step_ms[("head", eng.batch_size)] = dict.fromkeys(range(1, 9), ms)
    return eng


def _counted():
    """Counts of a batch's resident steps, loop entries and plain steps, as they run, and
    the step observer that counts them."""
    seen = {"steps": 0, "entries": 0, "plain": 0}

    def count(r):
        seen["entries"] += r.runner == "loop" and r.entry
        seen["steps"] += r.runner == "loop"
        seen["plain"] += r.runner == "plain"

    return seen, count


OFTEN = ModeTuning(retry=8, retry_max=8)  # a trial every 8 steps: every kind runs often


@pytest.mark.parametrize(
    "pad,vocab,modes,k",
    [
        ("0", None, False, 1),
        ("8", None, False, 1),
        ("8", 40, False, 1),
        ("0", None, True, None),
        ("0", None, False, 3),
        ("8", None, False, 3),
    ],
)
@pytest.mark.slow
def test_resident_greedy_output_is_plain_greedy(
    make_tiny, adapter_home, tmp_path, monkeypatch, pad, vocab, modes, k
):
    """Seven requests through three rows: the loop runs, is left for each admission and
    entered again; every output is plain greedy's, with one draft token a row, with chains
    of three and with chains of the length the batch chooses, under step modes. Its drafts
    are the head's: their share accepted is about that of the host-synced steps' drafts of
    the same length (the tiny head with a 40-token draft vocabulary has none accepted
    either way)."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home if vocab is None else tmp_path))
    monkeypatch.setenv("APPLESPEC_KV_PAD", pad)
    target = make_tiny(3)
    store_head(target, vocab=vocab)
    seen, count = _counted()
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=9 + 5 * i))
        for i, p in enumerate(WORKLOAD[:7])
    ]
    eng = Engine(
        target,
        draft="head",
        surface=FLAT,
        batch_size=3,
        resident=True,
        step_modes=modes,
        k=k,
        modes=OFTEN,  # (with step modes: the loop is left and entered again whichever wins)
        observers=[count],
    )
    out = _priced(eng, 0.02).generate_many(reqs)
    seen = dict(seen)  # (not the plain runs below)
    assert [r.tokens for r in out] == _plain(target, reqs)
    if modes:  # plain steps and loop steps, in turn
        assert seen["steps"] > 3 and seen["plain"] > 3 and seen["entries"] >= 2
    else:
        assert seen["steps"] > 20 and seen["entries"] >= 2 and seen["plain"] == 0
    spec = [r.speculative for r in out]
    assert all(s["accepted_tokens"] <= s["draft_tokens"] for s in spec)
    accepted = sum(s["accepted_tokens"] for s in spec)
    if k:  # (a chosen length varies)
        host = Engine(target, draft="head", surface=FLAT, batch_size=3, k=k).generate_many(reqs)
        rate = accepted / sum(s["draft_tokens"] for s in spec)
        synced = [r.speculative for r in host]
        synced_rate = sum(s["accepted_tokens"] for s in synced) / sum(
            s["draft_tokens"] for s in synced
        )
        assert (rate > 0.8 * synced_rate > 0.1) if vocab is None else (accepted == synced_rate == 0)
    assert sum(len(r.tokens) for r in out) <= sum(
        s["verify_steps"] + s["accepted_tokens"] + 1 for s in spec
    )


def test_each_loop_entry_reaches_the_step_modes_as_an_entry(make_tiny, adapter_home, monkeypatch):
    """Where the device runs ahead of the host, every step that enters the loop (its first
    chain drafted host-synced, its first step queued, nothing of its own read) is told to
    the step modes as an entry, and no other step of the loop's kind is: each step's flag
    is checked against whether that step entered the loop. Output stays plain greedy's."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    flags = []  # each measured step of the loop's kind: (told an entry, entered the loop)

    def recorded(r):
        if r.kind == "loop" and r.decoding:  # (None: a host-synced step, rows joining)
            flags.append((r.entry, r.entry if r.runner == "loop" else None))

    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=40)) for p in WORKLOAD[:4]]
    eng = Engine(
        target,
        draft="head",
        surface=FLAT,
        batch_size=3,
        resident=True,
        step_modes=True,
        runs_ahead=True,
        modes=OFTEN,  # trials often: the loop is entered again
        observers=[recorded],
    )
    out = _priced(eng, 0.02).generate_many(reqs)
    assert [r.tokens for r in out] == _plain(target, reqs)
    assert all(told == bool(was) for told, was in flags), flags
    counts = Counter(was for _, was in flags)
    assert counts[True] >= 2 and counts[False] > counts[True]


def test_resident_rows_stop_at_eos_and_stop_strings_as_plain_ones(
    make_tiny, adapter_home, monkeypatch
):
    """Rows that end at EOS or a stop string end where plain greedy ends them, though the
    loop ran them a step further before the host read their tokens."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    prompts = [target.encode_prompt(p) for p in WORKLOAD[:3]]
    free = _plain(target, [(p, GenerationParams(max_tokens=30)) for p in prompts])
    # EOS: a token of the first row's answer that the last row's first 14 tokens lack; a
    # stop string: two of the last row's tokens before that.
    eos = next(t for t in free[0][4:] if t not in free[2][:14])
    stop = target.decode(free[2][10:12])
    monkeypatch.setattr(LoadedModel, "eos_token_ids", property(lambda self: {eos}))
    reqs = [(p, GenerationParams(max_tokens=30, stop=[stop])) for p in prompts]
    # (step modes off: their timed choice of plain steps would make the loop's count vary)
    eng = Engine(
        target, draft="head", surface=FLAT, batch_size=3, resident=True, step_modes=False, k=1
    )
    seen, count = _counted()
    eng.observers.append(count)
    got = eng.generate_many(reqs)
    want = Engine(target, draft="none", surface=FLAT, batch_size=1)
    for r, (p, q) in zip(got, reqs, strict=True):
        w = want.generate(p, q)
        assert (r.tokens, r.text, r.finish_reason) == (w.tokens, w.text, w.finish_reason)
    assert got[0].finish_reason == "stop" and len(got[0].tokens) < len(free[0])
    assert got[2].finish_reason == "stop" and stop in target.decode(got[2].tokens)
    assert stop not in got[2].text  # cut where the stop string begins
    assert seen["steps"] > 3


@pytest.mark.parametrize("pad,k", [("0", 1), ("8", 1), ("8", 3)])
def test_sampled_rows_in_the_loop_draw_plain_seeded_samplings_tokens(
    make_tiny, adapter_home, monkeypatch, pad, k
):
    """Sampled rows beside greedy ones: the loop draws each row's tokens with its seed's
    uniform at each position, computed on the device, so every row's output is plain
    decoding's token for token (seeded sampling is a function of seed, prefix and
    position), whether it drafts one token a row or chains of three."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    monkeypatch.setenv("APPLESPEC_KV_PAD", pad)
    target = make_tiny(3)
    store_head(target)
    seen, count = _counted()
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=16 + 3 * i, **kw))
        for i, (p, kw) in enumerate(
            zip(
                WORKLOAD[:5],
                [
                    {"temperature": 0.8, "seed": 3},
                    {},
                    {"temperature": 1.0, "top_p": 0.9, "seed": 11},
                    {"temperature": 0.5, "top_k": 5, "seed": 7},
                    {"temperature": 0.8, "seed": 4},
                ],
                strict=True,
            )
        )
    ]
    eng = Engine(
        target,
        draft="head",
        surface=FLAT,
        batch_size=3,
        resident=True,
        step_modes=False,
        k=k,
        observers=[count],
    )
    out = eng.generate_many(reqs)
    seen = dict(seen)
    assert [r.tokens for r in out] == _plain(target, reqs)
    assert seen["steps"] > 20
    assert sum(r.speculative["accepted_tokens"] for r in out[:1] + out[2:]) > 0


def test_rows_asking_for_logprobs_and_other_drafters_do_not_run_the_loop(
    make_tiny, adapter_home, monkeypatch
):
    """A row asking for log-probabilities (read for every token on the host) keeps the
    host-synced drafting steps; so does a drafter other than the head alone."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    seen, count = _counted()
    p = target.encode_prompt(WORKLOAD[0])
    asked = GenerationParams(max_tokens=12, logprobs=True)
    eng = Engine(target, draft="head", surface=FLAT, batch_size=2, resident=True, observers=[count])
    r = eng.generate(p, asked)
    assert r.tokens == Engine(target, draft="none", surface=FLAT).generate(p, asked).tokens
    Engine(
        target, draft="ngram", surface=FLAT, batch_size=2, resident=True, observers=[count]
    ).generate(p, GenerationParams(max_tokens=12))
    assert seen["steps"] == 0


def test_a_step_where_rows_join_drafts_with_the_head(make_tiny, adapter_home, monkeypatch):
    """Seven requests through three rows with the head's loop: a step the loop cannot run
    because rows are joining drafts with the head, host-synced. A row asking for
    log-probabilities keeps the head drafting host-synced too (the loop cannot run while it
    lives). Output is plain greedy's."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    drafted = []  # per host-synced step with rows decoding: (a row asks logprobs, drafted)
    batch = None

    def recorded(r):
        if r.runner == "synced" and r.decoding:
            asks = any(s is not None and s.params.logprobs for s in batch.rows)
            drafted.append((asks, r.drafted > 0))

    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=9 + 5 * i))
        for i, p in enumerate(WORKLOAD[:7])
    ]
    eng = _priced(
        Engine(
            target,
            draft="head",
            surface=FLAT,
            batch_size=3,
            resident=True,
            k=1,
            observers=[recorded],
        ),
        0.02,
    )
    batch = eng.new_batch()
    out = _through(batch, reqs)
    assert [r.tokens for r in out] == _plain(target, reqs)
    assert sum(batch.loop.chains.values()) > 10
    joins = [d for asks, d in drafted if not asks]
    assert len(joins) >= 3  # rows joined while others decoded
    assert any(joins)
    drafted.clear()
    asked = [(reqs[0][0], GenerationParams(max_tokens=12, logprobs=True)), *reqs[1:3]]
    batch = eng.new_batch()
    out = _through(batch, asked)
    assert [r.tokens for r in out] == _plain(target, asked)
    assert any(d for asks, d in drafted if asks)


def test_the_loop_is_on_by_default_on_a_gpu_and_runs_without_step_modes(
    make_tiny, adapter_home, monkeypatch
):
    """`resident` unset: on where a GPU runs the model only. `step_modes` unset: off in a
    batch whose drafting is the loop's (the head alone), on for every other drafter; asked
    for, on in the loop too. The loop then runs every step, and output is plain greedy's."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    on_gpu = mx.default_device() == mx.gpu
    assert Engine(target, draft="head", surface=FLAT).config.resident == on_gpu
    loop = _priced(Engine(target, draft="head", surface=FLAT, batch_size=3, resident=True), 0.02)
    assert loop.new_batch().modes is None
    asked = Engine(target, draft="head", surface=FLAT, resident=True, step_modes=True)
    assert asked.new_batch().modes is not None
    assert Engine(target, draft="ngram", surface=FLAT, resident=True).new_batch().modes is not None
    assert Engine(target, draft="head", surface=FLAT, resident=False).new_batch().modes is not None
    seen, count = _counted()
    loop.observers.append(count)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=20)) for p in WORKLOAD[:3]]
    out = loop.generate_many(reqs)
    seen = dict(seen)
    assert [r.tokens for r in out] == _plain(target, reqs)
    assert seen["steps"] > 5 and seen["plain"] == 0


def test_the_loops_chain_length_follows_the_machines_costs(make_tiny, adapter_home, monkeypatch):
    """`k` unset: where verifying more tokens a row is free and the head's depths are
    cheap, the batch chooses chains of more than one token; where each token a row costs a
    whole plain step (a compute-bound machine), no chain pays and plain steps run. Output
    is plain greedy's either way."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=24)) for p in WORKLOAD[:3]]
    want = _plain(target, reqs)
    chains, plain = {}, {}
    for name, surface in (("free", FLAT), ("dear", DEAR)):
        eng = Engine(target, draft="head", surface=surface, batch_size=3, resident=True)
        batch = _priced(eng, 0.02).new_batch()
        out = _through(batch, reqs)
        assert [r.tokens for r in out] == want
        chains[name], plain[name] = batch.loop.chains, batch.steps - batch.loop.chains.total()
    assert max(chains["free"]) > 1 and chains["free"].total() > 5
    assert not chains["dear"] and plain["dear"] > 20


def test_where_no_chain_pays_the_loop_still_probes_now_and_then(
    make_tiny, adapter_home, monkeypatch
):
    """Each token a row costing a whole plain step, no chain pays and plain steps run; yet
    after `LOOP_PROBE` steps without a chain the best length runs for one choice's steps
    (its acceptance is measured only as it runs), each next probe waiting twice as long up
    to `LOOP_PROBE_MAX`. Output is plain greedy's."""
    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=40)) for p in WORKLOAD[:3]]
    often = dict(loop_choose_every=4, loop_probe=8, loop_probe_max=16)
    eng = Engine(target, draft="head", surface=DEAR, batch_size=3, resident=True, **often)
    batch = _priced(eng, 0.02).new_batch()
    out = _through(batch, reqs)
    assert [r.tokens for r in out] == _plain(target, reqs)
    probes = batch.loop.probes
    assert len(probes) >= 2 and [w for _, w in probes[:2]] == [16, 16]
    assert probes[1][0] - probes[0][0] >= 16  # the second waited twice the first's 8
    chains = batch.loop.chains
    assert 0 < chains.total() < batch.steps / 2, (chains, batch.steps)


def test_auto_tries_the_loop_beside_host_synced_drafting_and_plain_steps(
    make_tiny, tmp_path, monkeypatch
):
    """`auto` with a stored head where the loop can run: the step modes try three kinds,
    host-synced drafting (each row's drafter chosen among prompt lookup, the suffix index
    and the head), the head's loop and plain steps. Output is plain greedy's, and the
    loop's steps count as the head's alone, in statistics of their own: the loop verifies
    the whole chain on every row, unlike a host-synced step, and the rows' statistics see
    steps no drafter drafted host-synced."""
    from core.engine.draft_length import AcceptanceStats, RowPolicy

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    target = make_tiny(3)
    store_head(target)
    observed: dict[str, int] = {}  # drafter -> tokens it proposed, by its row statistics
    observe = RowPolicy.observe

    def counted(self, proposed, accepted):
        name = next(n for n, st in eng.acceptance.items() if st is self.carried)
        observed[name] = observed.get(name, 0) + proposed
        observe(self, proposed, accepted)

    monkeypatch.setattr(RowPolicy, "observe", counted)
    chained: list[int] = []  # the loop's statistics: tokens proposed, each step of a row
    stats_observe = AcceptanceStats.observe

    def chain_counted(self, proposed, accepted):
        if self is eng.acceptance.get("head (loop)"):
            chained.append(proposed)
        stats_observe(self, proposed, accepted)

    monkeypatch.setattr(AcceptanceStats, "observe", chain_counted)
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=60)) for p in WORKLOAD[:3]]
    eng = _priced(Engine(target, draft="auto", surface=FLAT, batch_size=3, resident=True), 0.02)
    batch = eng.new_batch()
    assert [d.name for d in batch.drafters] == ["forced", "ngram", "suffix", "head"]
    assert batch.modes.kinds == ("draft", "loop", "plain")
    off = Engine(target, draft="auto", surface=FLAT, batch_size=3, resident=False).new_batch()
    assert off.modes.kinds == ("draft", "plain")  # no loop: the head drafts host-synced
    out = _through(batch, reqs)
    assert [r.tokens for r in out] == _plain(target, reqs)
    assert all(batch.modes.steps[kind] >= batch.modes.tuning.block for kind in batch.modes.kinds)
    loop_tokens = sum(k * n for k, n in batch.loop.chains.items())
    assert loop_tokens > 0
    # every loop step's drafts went to the loop's statistics; the host-synced steps' to
    # the drafter each row chose (metrics: what each drafter proposed, in both)
    proposed = Counter()
    for r in out:
        proposed.update(r.speculative["draft_tokens_by_drafter"])
    assert sum(chained) >= loop_tokens and set(chained) == set(batch.loop.chains)
    assert observed.get("head", 0) + sum(chained) == proposed["head"]
    assert observed.get("ngram", 0) == proposed["ngram"]
    # the loop's chain length is chosen from the loop's statistics alone
    assert eng.acceptance["head (loop)"] is not eng.acceptance["head"]
    # after an engine failure the batch builds its drafters again: the loop's head with them
    batch.abandon()
    assert batch.loop.head is batch.drafters[-1] and batch.loop.head.name == "head"


@pytest.mark.parametrize("resident", [True, False])
@pytest.mark.slow
def test_each_kind_of_step_drafts_with_its_own_drafters(make_tiny, tmp_path, monkeypatch, resident):
    """Under `auto`, where the step modes weigh the head's loop as a kind of its own, the
    `draft` kind's host-synced steps choose among prompt lookup and the suffix index, and
    the loop's kind drafts with the head alone (host-synced in a step where the loop cannot
    run: rows joining, a row asking for log-probabilities). Without the loop, the head
    drafts host-synced beside the others as before. Plain steps draft nothing, also where
    they sync (that row). Output is plain greedy's either way."""
    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    target = make_tiny(3)
    store_head(target)
    by_kind: dict[str, Counter[str]] = {"head": Counter(), "lookup": Counter()}

    def recorded(r):  # host-synced steps with rows decoding: the drafters their rows chose among
        if r.runner == "synced" and r.decoding:
            for name in r.drafters:
                by_kind["head" if name == "head" else "lookup"][r.kind] += name != "forced"

    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=60)) for p in WORKLOAD[:6]]
    # a row asking for log-probabilities: while it runs, the loop's kind drafts host-synced
    reqs[0] = (reqs[0][0], GenerationParams(max_tokens=60, logprobs=True))
    eng = Engine(
        target,
        draft="auto",
        surface=FLAT,
        batch_size=3,
        resident=resident,
        modes=OFTEN,
        observers=[recorded],
    )
    batch = _priced(eng, 0.02).new_batch()
    out = _through(batch, reqs)
    assert [r.tokens for r in out] == _plain(target, reqs)
    assert batch.modes.steps["draft"] >= batch.modes.tuning.block
    assert by_kind["lookup"]["draft"] >= batch.modes.tuning.block
    assert batch.modes.steps["plain"] > 0
    assert by_kind["lookup"]["plain"] == by_kind["head"]["plain"] == 0  # plain, though synced
    if resident:
        assert by_kind["head"]["draft"] == 0
        assert by_kind["lookup"]["loop"] == 0
        assert by_kind["head"]["loop"] > 0
        assert sum(batch.loop.chains.values()) > 0
    else:
        assert by_kind["head"]["draft"] > 0  # the same rows choose the head where no loop runs
