"""The EAGLE-style feature head on a tiny float32 model: it reads only the target's last
hidden states and its own block, training lowers its KL and raises its held-out agreement
(first and second draft token), seeded, within 5% of the target's parameters."""

import mlx.core as mx
import numpy as np
import pytest

from core.engine.adapters.head import new_head, weight_share
from core.engine.scorer import head
from core.training.data import answer, features, split, top_tokens
from core.training.head import evaluate, head_examples, train_head
from tests.engine.test_adapters import WORKLOAD


def _data(target, with_answers: bool = False):
    train_p, held_p = split([target.encode_prompt(t) for t in WORKLOAD], 0.25, seed=0)
    train_ex = answer(target, train_p, 20, samples=1)
    held_ex = answer(target, held_p, 20)
    tr = head_examples(train_ex, features(target, train_ex, 1))
    ho = head_examples(held_ex, features(target, held_ex, 1))
    return (tr, ho, train_ex) if with_answers else (tr, ho)


def test_head_pairs_are_the_targets_state_its_next_token_and_the_state_after(make_tiny):
    target = make_tiny(0)
    prompt = target.encode_prompt(WORKLOAD[0])
    ex = answer(target, [prompt], 12)
    (x,) = head_examples(ex, features(target, ex, 1))
    assert x.n == len(ex[0].answer)  # every answer position but the last
    # The state at p gives x_{p+1} (greedy): the token the pair carries.
    assert head(target.model, x.h).argmax(-1).tolist() == x.tokens.tolist()
    # The teacher at p + 1 is the state at the next position.
    assert mx.allclose(x.teacher[:-1], x.h[1:]).item()


def test_training_the_head_lowers_the_kl_and_raises_held_out_agreement(make_tiny):
    target = make_tiny(0)
    tr, ho = _data(target)
    hd = new_head(target.model)
    r = train_head(target.model, hd, tr, ho, tokens=6000, batch=8, eval_every=2000, seed=0)
    assert r["kl_after"] < 0.5 * r["kl_before"], r
    assert r["after"] >= r["before"] + 0.15, r
    assert r["after_second"] >= r["before_second"] + 0.1, r
    assert r["curve"][0] == (0, r["before"], r["before_second"])
    assert r["curve"][-1] == (r["tokens"], r["after"], r["after_second"])
    assert evaluate(target.model, hd, ho)[0] == r["after"]
    again = new_head(target.model)
    r2 = train_head(target.model, again, tr, ho, tokens=6000, batch=8, eval_every=2000, seed=0)
    assert r2["curve"] == r["curve"]  # seeded


def test_a_reduced_vocabulary_head_trains_through_it_and_misses_the_tokens_outside(make_tiny):
    """With a draft vocabulary (the tokens the training answers hold most) the head trains
    and is measured through those rows only: it still learns, a held-out target token
    outside them is a miss, and scoring every token that way is the whole head exactly."""
    target = make_tiny(0)
    tr, ho, train_ex = _data(target, with_answers=True)
    vocab = top_tokens(train_ex, 40, target.eos_token_ids)
    assert 1 < vocab.size <= 40
    hd = new_head(target.model)
    r = train_head(
        target.model, hd, tr, ho, tokens=6000, batch=8, eval_every=0, seed=0, vocab=vocab
    )
    assert r["kl_after"] < 0.5 * r["kl_before"], r
    assert r["after"] >= r["before"] + 0.15, r
    want = mx.concatenate([head(target.model, x.teacher).argmax(-1) for x in ho])
    inside = mx.any(want[:, None] == vocab[None, :], axis=1).mean().item()
    assert inside < 1.0  # some held-out tokens lie outside the 40
    assert r["after"] <= inside
    V = target.model.model.embed_tokens.weight.shape[0]
    whole = mx.arange(V, dtype=mx.int32)
    assert evaluate(target.model, hd, ho, vocab=whole)[:2] == evaluate(target.model, hd, ho)[:2]
    assert weight_share(target.model, 40) < weight_share(target.model)


# -- the head as an engine drafter (`--draft head`) -------------------------------------


def _offline_logits(target, adapter, prompt: list[int], output: list[int], path: list[int]):
    """The head's draft logits after `prompt + output` and the draft tokens `path`, computed
    over whole sequences: the target's states at positions len(prompt) - 1 .. end - 2
    paired with the output tokens, the head causally over all pairs, each path token's pair
    appended with the predicted state (EAGLE's chain); -inf off its draft vocabulary."""
    from core.engine.adapters.block import prefix_hidden
    from core.training.head import scorer

    ids = mx.array([prompt + output[:-1]])
    _, final = prefix_hidden(target.model, ids, 1)
    h = final[0, len(prompt) - 1 :]  # (n, D): one state per output token
    toks = list(output)
    pred = adapter.block(
        target.model, h[None], mx.array([toks]), "causal" if len(toks) > 1 else None
    )
    for t in path:
        h = mx.concatenate([h, pred[0, -1:]])
        toks.append(t)
        pred = adapter.block(target.model, h[None], mx.array([toks]), "causal")
    small = scorer(target.model, adapter.vocab)(pred[0, -1]).astype(mx.float32)
    if adapter.vocab is None:
        return small
    full = mx.full((target.model.model.embed_tokens.weight.shape[0],), -mx.inf)
    full[adapter.vocab] = small
    return full


def _path(parents: list[int], j: int) -> list[int]:
    """Node j's path from the root's child (drafts-only parents: -1 = the root)."""
    out = [j]
    while parents[out[0]] >= 0:
        out.insert(0, parents[out[0]])
    return out


def _offline_chain(target, adapter, prompt: list[int], output: list[int], k: int) -> list[int]:
    """The chain the head drafts greedily (`_offline_logits`' argmax, k times)."""
    out: list[int] = []
    for _ in range(k):
        out.append(int(_offline_logits(target, adapter, prompt, output, out).argmax().item()))
    return out


def _engine_drafts(monkeypatch, target, spec: str, k: int) -> list[tuple]:
    """Five requests through a 3-row engine drafting with `spec` at fixed k (rows joining,
    finishing, prefill and plain steps between); its output must be plain greedy's.
    Returns, per row of every draft: (prompt, output so far, k asked, the row's tokens,
    parents and chances (None for a chain), the head)."""
    from core.engine import CostSurface, Engine, GenerationParams
    from core.engine.drafters.feature_head import FeatureHeadDrafter

    seen = []
    propose = FeatureHeadDrafter.propose

    def spy(self, seqs, ks):
        draft = propose(self, seqs, ks)
        chain = isinstance(draft.tokens, mx.array)
        toks = draft.tokens.tolist() if chain else draft.tokens
        for i, s in enumerate(seqs):
            parents = None if chain else draft.parents[i]
            chances = None if chain else draft.chances[i]
            row = (list(s.prompt), list(s.output), ks[i], toks[i][: ks[i]], parents, chances)
            seen.append((*row, self.adapter))
        return draft

    monkeypatch.setattr(FeatureHeadDrafter, "propose", spy)
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=10 + 7 * i))
        for i, p in enumerate(WORKLOAD[:5])
    ]
    eng = Engine(target, draft=spec, surface=CostSurface.flat(), batch_size=3, k=k)
    got = [r.tokens for r in eng.generate_many(reqs)]
    plain = Engine(target, draft="none", surface=CostSurface.flat(), batch_size=1)
    assert got == [plain.generate(p, q).tokens for p, q in reqs]
    assert len(seen) > 10
    return seen


@pytest.mark.parametrize("vocab,pad", [(None, "0"), (40, "0"), (None, "8")])
@pytest.mark.slow
def test_the_engine_drafts_what_the_head_computes_over_whole_sequences(
    make_tiny, adapter_home, tmp_path, monkeypatch, vocab, pad
):
    """Every chain the batched engine drafts is the head's chain over the row's whole
    history: the states it reads are the target's at exactly those positions. A head
    with a reduced draft vocabulary drafts the best of its tokens. Output is plain
    greedy's. With CUDA's padded reads (`pad` > 0) the head's block runs over every slot
    with a power-of-two query count (a few attention shapes) and drafts the same chains."""
    from core.engine.drafters import feature_head
    from tests.engine.conftest import store_head

    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home if vocab is None else tmp_path))
    monkeypatch.setenv("APPLESPEC_KV_PAD", pad)
    target = make_tiny(3)
    store_head(target, vocab=vocab)
    segs = []
    fwd = feature_head.forward
    monkeypatch.setattr(
        feature_head, "forward", lambda m, c, ss, **kw: (segs.extend(ss), fwd(m, c, ss, **kw))[1]
    )
    seen = _engine_drafts(monkeypatch, target, "head:1", 3)
    if pad != "0":
        assert all(s.rows == [0, 1, 2] and s.min_w & (s.min_w - 1) == 0 for s in segs)
        assert {s.min_w for s in segs} <= {1, 2, 4}
        assert any(len(set(s.sizes)) > 1 for s in segs)  # drafting slots beside dummies
    else:
        assert any(len(s.rows) < 3 for s in segs)
    for prompt, output, _, drafted, _, _, adapter in seen:
        want = _offline_chain(target, adapter, prompt, output, len(drafted))
        assert drafted == want, (len(output), drafted, want)
    if vocab is not None:
        assert 1 < seen[0][-1].vocab.size <= vocab
        assert {t for s in seen for t in s[3]} <= set(seen[0][-1].vocab.tolist())


@pytest.mark.slow
@pytest.mark.parametrize("vocab", [None, 40])
def test_a_head_tree_holds_the_heads_likeliest_tokens_at_every_node(
    make_tiny, adapter_home, tmp_path, monkeypatch, vocab
):
    """`head:2`: every tree the batched engine drafts has the k nodes asked for; each
    node's token is among the 2 the head ranks highest after its parent's path, computed
    over the row's whole history, each parent's first child is the head's best token
    there, and each node's chance is the head's probability of its path. Output is plain
    greedy's."""
    from tests.engine.conftest import store_head

    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home if vocab is None else tmp_path))
    target = make_tiny(4)
    store_head(target, vocab=vocab)
    seen = _engine_drafts(monkeypatch, target, "head:2", 8)
    branched = 0
    for prompt, output, k, toks, parents, chances, adapter in seen:
        assert len(toks) == len(parents) == len(chances) == k
        assert all(p < j for j, p in enumerate(parents))  # parents first
        branched += len(set(parents)) < len(parents)
        for j, (t, p) in enumerate(zip(toks, parents, strict=True)):
            path = [] if p < 0 else [toks[q] for q in _path(parents, p)]
            logits = _offline_logits(target, adapter, prompt, output, path)
            ranked = mx.sort(logits)[::-1]
            assert logits[t].item() >= ranked[1].item() - 1e-4, (j, path, t)
            if parents.index(p) == j:  # the parent's first child
                assert logits[t].item() >= ranked[0].item() - 1e-4, (j, path, t)
            # Its chance: the head's probability of the path root -> node.
            prob = mx.softmax(logits)[t].item() * (1.0 if p < 0 else chances[p])
            assert chances[j] == pytest.approx(prob, rel=1e-3), (j, path, t)
    assert branched > len(seen) // 2  # trees, not only chains
    deep = sum(
        len(_path(parents, j)) >= 3 for *_, parents, _, _ in seen for j in range(len(parents))
    )
    assert deep > len(seen)  # nodes whose parent's state came from a forward over a path


def test_a_head_for_another_model_is_refused_and_none_stored_names_calibrate(
    make_tiny, tmp_path, monkeypatch
):
    import pytest

    from core.engine import CostSurface, Engine
    from core.engine.adapters import AdapterError, load, save
    from core.engine.adapters.head import new_head_adapter

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    a, b = make_tiny(0), make_tiny(1)
    with pytest.raises(AdapterError, match="--exit-layer head"):
        Engine(b, draft="head", surface=CostSurface.flat(), batch_size=1)
    path = save(a, new_head_adapter(a.model), {"agreement": 0.5})
    assert path.name.startswith("feature-head-")
    assert load(path, a).kind == "feature-head"
    with pytest.raises(AdapterError, match="was made for model"):
        load(path, b)
    path.write_bytes(path.read_bytes()[:-100])  # truncated
    with pytest.raises(AdapterError, match="corrupt"):
        load(path, a)
    # `auto` goes on without it.
    eng = Engine(a, draft="auto", surface=CostSurface.flat(), batch_size=1)
    assert eng.adapter is None


def test_a_stored_heads_measured_agreement_is_the_engines_prior(make_tiny, tmp_path, monkeypatch):
    """A calibrated head's held-out agreement is where the engine's acceptance statistics
    for its first draft token start (deeper ones: the kind's prior), and rows start from it
    without a warm-up
    at K_INIT; an untrained head (online learning's first version) has no measurement and
    keeps the guessed prior and the warm-up."""
    from core.engine import CostSurface, Engine
    from core.engine.adapters import save
    from core.engine.adapters.head import new_head_adapter
    from core.engine.draft_length import PRIORS, RowPolicy
    from core.engine.drafters.feature_head import FeatureHeadDrafter

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    target = make_tiny(0)
    save(target, new_head_adapter(target.model), {"agreement": 0.55, "second": 0.3})
    eng = Engine(target, draft="head", surface=CostSurface.flat(), batch_size=2)
    (drafter,) = eng.new_batch(2).drafters
    _, h2, h3 = PRIORS["early-exit"]
    assert drafter.prior == (0.55, h2, h3)
    stats = eng.carried(drafter)
    assert [stats.rate(j) for j in range(4)] == pytest.approx([0.55, h2, h3, h3])
    assert not RowPolicy(stats).warming()
    untrained = FeatureHeadDrafter(target, 2, new_head_adapter(target.model))
    assert untrained.prior is None
    untrained.name = "head-untrained"
    fresh = eng.carried(untrained)
    assert fresh.rate(0) == pytest.approx(PRIORS["early-exit"][0])
    assert RowPolicy(fresh).warming()


@pytest.mark.slow
def test_where_a_token_costs_time_rows_verify_only_the_heads_likely_nodes(
    make_tiny, tmp_path, monkeypatch
):
    """On a compute-bound surface (a verified token costs most of a plain one) the engine
    asks the head how sure it is: each chain token carries the head's probability of it,
    calibrated into a chance per node, and each gate keeps the nodes of highest chance
    (a kept node's chance is never below a dropped one's). Some nodes are dropped, some
    kept; output is plain greedy's."""
    from core.engine import Engine, GenerationParams, proposal
    from core.engine.adapters import load, save
    from core.engine.drafters.feature_head import FeatureHeadDrafter
    from tests.engine.conftest import store_head
    from tests.engine.test_draft_length import CPU

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    target = make_tiny(0)
    # A head the engine trusts (a high stored agreement): rows draft deep, the gate decides.
    save(target, load(store_head(target, tokens=6000, vocab=40), target), {"agreement": 0.95})
    asked, gated = [], []
    chances = FeatureHeadDrafter.chances

    def spy_chances(self, seqs, draft):
        probs, toks = np.array(draft.confidence), np.array(draft.tokens)
        for r, s in enumerate(seqs):
            n = draft.sizes[r]
            row = (list(s.prompt), list(s.output), toks[r, :n].tolist(), probs[r, :n].tolist())
            asked.append((*row, self.adapter))
        return chances(self, seqs, draft)

    real_gate = proposal.gate_nodes

    def spy_gate(offers, ks, ch, surface):
        kept = real_gate(offers, ks, ch, surface)
        gated.append((ch, kept, [o.forced for o in offers]))
        return kept

    monkeypatch.setattr(FeatureHeadDrafter, "chances", spy_chances)
    monkeypatch.setattr(proposal, "gate_nodes", spy_gate)
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=30 + 4 * i))
        for i, p in enumerate(WORKLOAD[:6])
    ]
    eng = Engine(target, draft="head", surface=CPU, batch_size=3, step_modes=False)
    got = [r.tokens for r in eng.generate_many(reqs)]
    plain = Engine(target, draft="none", surface=CPU, batch_size=1)
    assert got == [plain.generate(p, q).tokens for p, q in reqs]
    assert asked and gated
    for prompt, output, toks, probs, adapter in asked[:10]:
        for j, t in enumerate(toks):
            logits = _offline_logits(target, adapter, prompt, output, toks[:j])
            assert probs[j] == pytest.approx(mx.softmax(logits)[t].item(), abs=1e-4)
    kept_n = dropped_n = probes = 0
    for ch, kept, forced in gated:  # forced nodes (a row's probe) are kept whatever they say
        assert all(kept[r] >= min(forced[r], len(cs)) for r, cs in ch.items())
        keep = [c for r, cs in ch.items() for c in cs[forced[r] : kept[r]]]
        drop = [c for r, cs in ch.items() for c in cs[kept[r] :]]
        if keep and drop:
            assert min(keep) >= max(drop)
        kept_n, dropped_n = kept_n + len(keep), dropped_n + len(drop)
        probes += sum(min(forced[r], kept[r]) for r in ch)
    assert kept_n and dropped_n and probes, (kept_n, dropped_n, probes)


@pytest.mark.parametrize("pad", ["0", "8"])
def test_a_drafting_depth_is_priced_by_timing_one_here(make_tiny, monkeypatch, pad):
    """The head's step cost is one drafting depth (block, logits, tokens) timed on this
    machine over the batch's rows, at the powers of two around them (interpolated, each
    timed once), in plain target steps at that batch. The depths timed run the head over
    that many rows on a scratch cache: the live rows' head cache is untouched. Without a
    plain step's cost it is the share of weights the head reads."""
    from core.engine.adapters.head import new_head_adapter
    from core.engine.drafters import feature_head

    monkeypatch.setenv("APPLESPEC_KV_PAD", pad)
    target = make_tiny(0)
    head = feature_head.FeatureHeadDrafter(
        target, 8, new_head_adapter(target.model), plain_ms=lambda rows: 10.0 * rows
    )
    assert head._measured_depth(2) > 0.0  # really timed once
    timed = []

    def fake_best_ms(run, repeats=2):
        tokens = run()  # one depth's drafted tokens: (rows,)
        mx.eval(tokens)
        timed.append(tokens.shape[0])
        return 1.0 + tokens.shape[0]

    monkeypatch.setattr(feature_head, "best_ms", fake_best_ms)
    head._depth_ms.clear()
    head.cache.lengths[:] = 5
    assert head.step_cost(4) == pytest.approx(5.0 / 40.0)
    assert head.step_cost(6) == pytest.approx(7.0 / 60.0)  # between 4 rows' 5 ms and 8's 9
    assert head.step_cost(5) == pytest.approx(6.0 / 50.0)
    assert timed == [4, 8]  # each row count timed once
    assert head.cache.lengths.tolist() == [5] * 8 and head.cache.keys[0] is None
    unpriced = feature_head.FeatureHeadDrafter(target, 8, new_head_adapter(target.model))
    assert unpriced.step_cost(4) == unpriced._share > 0.0


def test_the_engine_times_the_heads_depth_once_for_all_its_batches(
    make_tiny, adapter_home, monkeypatch
):
    """With the draft length chosen per step (no fixed k) the engine prices the head's
    depths by timing them; the timings stay with the engine, so its next batch times
    nothing. Output is plain greedy's."""
    from core.engine import Engine, GenerationParams
    from core.engine.drafters import feature_head
    from tests.engine.conftest import store_head
    from tests.engine.test_draft_length import CPU

    monkeypatch.setenv("APPLESPEC_HOME", str(adapter_home))
    target = make_tiny(3)
    store_head(target)
    timed = []
    real = feature_head.best_ms
    monkeypatch.setattr(feature_head, "best_ms", lambda run: timed.append(1) or real(run))
    reqs = [
        (target.encode_prompt(p), GenerationParams(max_tokens=12 + 3 * i))
        for i, p in enumerate(WORKLOAD[:4])
    ]
    eng = Engine(target, draft="head", surface=CPU, batch_size=4, step_modes=False)
    got = [r.tokens for r in eng.generate_many(reqs)]
    first = len(timed)
    assert first >= 2  # 4 rows and fewer, as they finish
    assert [r.tokens for r in eng.generate_many(reqs)] == got
    assert len(timed) == first
    (kept,) = eng.step_ms.values()
    assert set(kept) >= {4} and all(ms > 0 for ms in kept.values())
    plain = Engine(target, draft="none", surface=CPU, batch_size=1)
    assert got == [plain.generate(p, q).tokens for p, q in reqs]


@pytest.mark.slow
def test_a_probe_of_the_head_never_takes_a_row_a_better_offer_holds(
    make_tiny, tmp_path, monkeypatch
):
    """Under `auto` the head probes a row it has not drafted for a while (a forced node that
    teaches its chances), but only where the row would choose it: a row whose prompt lookup
    or suffix index offers more keeps that drafter's step. Output is plain greedy's."""
    from core.engine import Engine, GenerationParams, proposal
    from core.engine.proposal import Proposal
    from tests.engine.conftest import store_head
    from tests.engine.test_draft_length import FLAT

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    target = make_tiny(0)
    store_head(target)
    offers, rates, taken = {}, {}, []
    offer, alone, plan_of = Proposal.offer, proposal.alone_rate, Proposal.plan

    def spy_offer(self, d, s, i, lookups, cap):
        o = offer(self, d, s, i, lookups, cap)
        if o is not None:
            offers.setdefault(i, []).append((d.name, o))
        return o

    def spy_alone(o, marginal, cost):
        rates[id(o)] = r = alone(o, marginal, cost)
        return r

    def spy_plan(self, decode, drafters):
        offers.clear()
        plan = plan_of(self, decode, drafters)
        for i, d in enumerate(plan.choice):
            mine = {n: o for n, o in offers.get(i, [])}
            if "head" in mine and mine["head"].probe:
                best = (
                    max(rates[id(o)] for n, o in mine.items() if n != "head")
                    if len(mine) > 1
                    else 0
                )
                taken.append((d is not None and d.name == "head", rates[id(mine["head"])], best))
        return plan

    monkeypatch.setattr(Proposal, "offer", spy_offer)
    monkeypatch.setattr(proposal, "alone_rate", spy_alone)
    monkeypatch.setattr(Proposal, "plan", spy_plan)
    # repetitive answers: prompt lookup and the suffix index have much to offer
    prompts = [WORKLOAD[i % 4] + " " + WORKLOAD[i % 4] for i in range(8)]
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=48)) for p in prompts]
    eng = Engine(target, draft="auto", surface=FLAT, batch_size=4, step_modes=False)
    got = [r.tokens for r in eng.generate_many(reqs)]
    plain = Engine(target, draft="none", surface=FLAT, batch_size=1)
    assert got == [plain.generate(p, q).tokens for p, q in reqs]
    beaten = [t for t in taken if t[2] > t[1]]  # probes due where another offer rated higher
    assert beaten and not any(head for head, _, _ in beaten)
    # (where the head is the row's choice its probes hold: the gate test above counts them)
