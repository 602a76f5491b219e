"""The job-level suffix index and its drafter: incremental adds equal a fresh build, the most
frequent continuation of the longest match wins, prompts count less than answers, matches
are on characters (whatever the tokenization), memory stays within its bound; through the
engine, output is plain greedy's and a job with a shared answer format accepts more later."""

import random
from types import SimpleNamespace

import pytest

from core.engine import CostSurface, Engine, GenerationParams
from core.engine.drafters import suffix
from core.engine.drafters.suffix import (
    KEY,
    MAX_MATCH,
    PROMPT_WEIGHT,
    START,
    Corpora,
    SuffixDrafter,
    SuffixIndex,
)
from core.engine.sequence import Sequence
from core.models import LoadedModel

ANSWERS = [
    '{"name": "Maria Lopez", "city": "Madrid", "label": "positive"}',
    '{"name": "John Smith", "city": "Boston", "label": "negative"}',
    '{"name": "Aiko Tanaka", "city": "Osaka", "label": "positive"}',
]


def query(text: str) -> str:
    return START * KEY + text


def test_incremental_adds_equal_a_fresh_build():
    grown = SuffixIndex()
    for i, a in enumerate(ANSWERS * 3):
        grown.add(a)
        grown.add(f"prompt {i}: label the review", PROMPT_WEIGHT)
    fresh = SuffixIndex()
    fresh.rebuild(list(grown.docs))
    assert {k: list(v) for k, v in grown._index.items()} == {
        k: list(v) for k, v in fresh._index.items()
    }
    assert (grown._chars[: grown._n] == fresh._chars[: fresh._n]).all()
    for q in QUERIES:
        assert grown.continuation(query(q), 40) == fresh.continuation(query(q), 40)


QUERIES = ('{"name": "', '"city": "', '", "label": "', '{"name": "John Smith", "city": "Bo', "")


def test_rows_still_generating_are_drafted_from_and_close_into_finished_answers():
    index = SuffixIndex()
    index.add(ANSWERS[1])
    ahead, own = index.open(200), index.open(200)
    index.extend(ahead, '{"name": "Maria Lopez", "city": "Madrid", "la')
    # another row drafts from the row ahead of it, up to where that row has got
    text, shares, _ = index.continuation(query('{"name": "Maria Lopez", "ci'), 40)
    assert text == 'ty": "Madrid", "la'
    # a row's own end is unknown, not a candidate: the finished answer continues it
    index.extend(own, '{"name": "John Smith", "city": "Bo')
    text, _, _ = index.continuation(query('{"name": "John Smith", "city": "Bo'), 40)
    assert text == 'ston", "label": "negative"}'
    # text that rewrites what was written stops the region where it is
    index.extend(own, '{"name": "John Smith", "city": "Ba')
    assert own.stale
    index.close(ahead, ANSWERS[0])  # in place
    index.close(own, ANSWERS[2])  # re-added whole, its region given up
    grows = index.open(4)  # moves to larger regions as it grows
    for n in range(1, len(ANSWERS[0]) + 1, 5):
        index.extend(grows, ANSWERS[0][:n])
    assert grows.cap >= len(grows.text) > 4 and not grows.stale
    text, _, _ = index.continuation(query('{"name": "Maria Lopez", "city": "Ma'), 40)
    assert text.startswith('drid", "la')
    index.close(grows, ANSWERS[0])
    gone = index.open(50)
    index.extend(gone, '{"name": "Nobody Here", "city": "Nowhere"')
    index.abandon(gone)
    assert [t for t, _ in index.docs] == [ANSWERS[1], ANSWERS[0], ANSWERS[2], ANSWERS[0]]
    assert index.outputs == 4
    fresh = SuffixIndex()
    fresh.rebuild(list(index.docs))
    for q in (*QUERIES, '{"name": "Nobody H', '{"name": "John Smith", "city": "Ba'):
        assert index.continuation(query(q), 40) == fresh.continuation(query(q), 40), q


def test_live_regions_survive_a_rebuild_and_count_against_the_bound():
    index = SuffixIndex(max_chars=4_000)
    live = index.open(10_000)
    assert live.cap == 1_024  # LIVE_START at first
    index.extend(live, '{"id": 0, "label": "spam", "note": "live"}')
    for i in range(200):
        index.add(f'{{"id": {i}, "label": "ham"}}')
        assert index.chars <= 4_000
    assert len(index.docs) < 200  # the oldest were dropped, the live region placed again
    text, _, _ = index.continuation(query('{"id": 0, "label": "spam", "no'), 20)
    assert text == 'te": "live"}'


def test_many_long_rows_stay_within_the_bound():
    index = SuffixIndex(max_chars=50_000)
    rows = [index.open(8 * 4096) for _ in range(64)]  # 64 rows of max_tokens 4096
    for step in range(1, 40):
        for i, live in enumerate(rows):
            index.extend(live, "".join(f"row {i} says {j}. " for j in range(step)))
        assert index.chars <= 50_000
    assert index.nbytes() < 50_000 * 20
    # live regions hold half the bound at most: the rows beyond it are no longer written
    # live (their whole answers land when they finish); the others still are
    live = [i for i, r in enumerate(rows) if not r.stale]
    assert 0 < len(live) < 64
    i = live[0]
    text, _, _ = index.continuation(query(f"row {i} says 3. row {i} says"), 8)
    assert text == " 4. row "


def one_character_rule(index: SuffixIndex, query: str, n: int):
    """`SuffixIndex.continuation` spelled out one character at a time on Python lists: the
    longest suffix of the query found, extended backwards character by character, then the
    walk (all agree: that character, an end or unwritten text stops; else unwritten text
    drops out and the heaviest character wins, a tie to the most recent candidate)."""
    from math import fsum

    chars, weights = index._chars.tolist(), index._weights.tolist()
    q = [ord(c) for c in query[-suffix.MAX_MATCH :]]
    cand = [p for p in index._index.get(query[-suffix.KEY :], []) if chars[p] != suffix.PENDING]
    cand = [p for p in cand if chars[p - 1] == q[-1]]
    length = suffix.KEY
    while cand and length < len(q):
        longer = [p for p in cand if chars[p - length - 1] == q[-length - 1]]
        if not longer:
            break
        cand, length = longer, length + 1
    anchored = length >= len(q) or query[-length - 1 : -length] == suffix.START
    if not cand or (length < suffix.MIN_MATCH and not anchored):
        return "", [], [], False
    cand = sorted(cand)[-suffix.WALKED :]
    end, out, shares, support, ended = ord(suffix.END), [], [], [], False
    at = {p: p for p in cand}  # candidate -> its position now
    for _ in range(n):
        nxt = {p: chars[min(at[p], index._n - 1)] for p in cand}
        if len(set(nxt.values())) == 1:
            c = next(iter(nxt.values()))
            if c in (end, suffix.PENDING):
                ended = c == end
                break
            share = 1.0
        else:
            cand = [p for p in cand if nxt[p] != suffix.PENDING]
            if not cand:
                break
            weight = {
                c: fsum(weights[p] for p in cand if nxt[p] == c) for c in set(nxt[p] for p in cand)
            }
            c = max(weight, key=lambda c: (weight[c], max(p for p in cand if nxt[p] == c)))
            if c == end:
                ended = True
                break
            share = weight[c] / fsum(weight.values()) if len(weight) > 1 else 1.0
        cand = [p for p in cand if nxt[p] == c]
        for p in cand:
            at[p] += 1
        out.append(c)
        shares.append(share)
        support.append(sum(weights[p] >= 1.0 for p in cand))
    return "".join(map(chr, out)), shares, support, ended


@pytest.mark.parametrize("walked", [suffix.WALKED, 8])
def test_the_sorted_walk_and_block_matches_give_the_one_character_rule(monkeypatch, walked):
    """Matches extended backwards in blocks and walks on sorted windows give what one
    character at a time gives: random answers over a small alphabet branch everywhere,
    prompts and live rows (pending text) among them; with few candidates walked, the same
    most recent ones."""
    monkeypatch.setattr(suffix, "WALKED", walked)
    rng = random.Random(7)
    words = ["ab", "ba", "abc", "ca", "b", "cab", '": "', "a"]

    def text(n):
        return "".join(rng.choice(words) for _ in range(n))

    index = SuffixIndex()
    for i in range(60):
        index.add(text(rng.randint(3, 30)), 1.0 if i % 3 else PROMPT_WEIGHT)
    for _ in range(4):
        index.extend(index.open(200), text(8))
    asked = [(query(text(rng.randint(1, 25))), rng.randint(1, 40)) for _ in range(300)]
    fast = [index.walk(q, n) for q, n in asked]
    slow = [one_character_rule(index, q, n) for q, n in asked]
    assert sum(len(f[0]) > 1 for f in fast) > 100  # most queries continue
    assert 50 < sum(f[3] for f in fast) < 250  # some walks end at an end, others do not
    assert sum(0 < s < 1 for f in fast for s in f[1]) > 100  # and branch on the way
    for f, s, q in zip(fast, slow, asked, strict=True):
        assert (f[0], f[2], f[3]) == (s[0], s[2], s[3]), q
        assert f[1] == pytest.approx(s[1]), q


def test_the_most_frequent_continuation_of_the_longest_match_wins():
    index = SuffixIndex()
    for a in ANSWERS:
        index.add(a)
    # an answer's start: every answer begins alike, then the names differ
    text, shares, support = index.continuation(query(""), 30)
    n = len('{"name": "')
    assert text.startswith('{"name": "Aiko Tanaka"')  # a three-way tie: the latest answer
    assert shares[:n] == [1.0] * n and support[:n] == [3] * n
    assert shares[n] == pytest.approx(1 / 3) and support[n] == 1
    # after a label key, "positive" twice against "negative" once
    text, shares, _ = index.continuation(
        query('{"name": "Ivan Petrov", "city": "Kiev", "label": "'), 30
    )
    assert text == 'positive"}'
    assert shares[0] == pytest.approx(2 / 3) and shares[1:] == [1.0] * (len(text) - 1)
    # the longest match decides: "Boston" follows "city": "Bo" in one answer only
    text, _, support = index.continuation(query('{"name": "X Y", "city": "Bo'), 30)
    assert text.startswith('ston", "label": "negative"') and support[0] == 1
    # nothing long enough in common: nothing proposed
    assert index.continuation(query("zzzzzzzz"), 10) == ("", [], [])


def test_prompts_count_less_than_answers():
    index = SuffixIndex()
    index.add("the label is: spam")
    for _ in range(4):
        index.add("the label is: ham", PROMPT_WEIGHT)
    text, shares, _ = index.continuation(query("so the label is: "), 10)
    assert text == "spam"  # 1 answer outweighs 4 prompts at 0.2
    assert shares[0] == pytest.approx(1 / (1 + 4 * PROMPT_WEIGHT))
    # a prompt's start is not an answer's start
    only_prompts = SuffixIndex()
    only_prompts.add("Classify this review", PROMPT_WEIGHT)
    assert only_prompts.continuation(query(""), 10) == ("", [], [])


def test_memory_stays_within_its_bound_on_a_long_job():
    index = SuffixIndex(max_chars=20_000)
    peak = 0
    for i in range(2_000):
        index.add(f'{{"id": {i}, "label": "{"positive" if i % 3 else "negative"}"}}')
        assert index.chars <= 20_000
        peak = max(peak, index.nbytes())
    assert index.outputs == 2_000 and len(index.docs) < 2_000  # the oldest were dropped
    assert peak < 20_000 * 20  # chars, weights and positions: a few bytes per character
    text, _, _ = index.continuation(query('{"id": 5000, "label": "'), 12)
    assert text == 'positive"}'  # the newest answers remain


def test_corpora_keep_one_index_per_job_and_drop_the_oldest():
    corpora = Corpora(max_jobs=2)
    a, b = corpora.get("a"), corpora.get("b")
    assert corpora.get("a") is a
    corpora.get("c")  # "b" is the least recently used
    assert "b" not in corpora and "a" in corpora and b is not corpora.get("b")
    corpora.drop("a")
    assert "a" not in corpora


@pytest.mark.real_model
def test_matches_on_characters_across_tokenizations():
    """The stored answer says `"label": "positive"`; a row that wrote `"lab` + `el` in other
    tokens than the stored answer's still gets the continuation, as tokens that re-tokenize
    its own last tokens."""
    from core.models.loading import load_tokenizer

    tok, _ = load_tokenizer("smollm2-135m")
    target = SimpleNamespace(
        decode=lambda ids: tok.decode(ids),
        encode_text=lambda t: list(tok.encode(t, add_special_tokens=False)),
        encode_texts=lambda ts: [list(tok.encode(t, add_special_tokens=False)) for t in ts],
    )
    drafter = SuffixDrafter(target, Corpora())
    stored = '{"name": "Maria", "label": "positive"}'
    drafter.corpora.get("job").add(stored)
    written = '{"name": "Omar", "lab'
    natural = target.encode_text(written)
    # the same text in other tokens: "lab" spelled one character per token
    odd = target.encode_text(written[:-3]) + [target.encode_text(c)[0] for c in "lab"]
    assert odd != natural and target.decode(odd) == written
    for output in (natural, odd):
        seq = Sequence(prompt=[1], params=GenerationParams(), max_tokens=64, seed=0)
        seq.corpus, seq.output = "job", list(output)
        drafter.admit(seq)
        draft = drafter.propose([seq], [8])
        got = target.decode(output + draft.host_tokens(0))
        assert got.startswith(written) and '"positive"' in got, got
        assert all(0 < c <= 1 for c in draft.chances[0])
        drafter.retire(seq)


def _labeling_job(model: LoadedModel, n: int):
    names = "Maria John Aiko Peter Fatima Lukas Chen Olivia Mateo Priya Noah Elena".split()
    cities = "Madrid Boston Osaka Leeds Cairo Munich Shanghai Denver Lima Pune Austin Milan".split()
    reqs = []
    for i in range(n):
        text = (
            'Return JSON {"name": ..., "city": ...} for this text.\n'
            f"Text: {names[i % 12]} lives in {cities[(i * 5) % 12]}."
        )
        reqs.append(
            (
                model.encode_chat([{"role": "user", "content": text}]),
                GenerationParams(max_tokens=24),
            )
        )
    return reqs


@pytest.mark.slow
@pytest.mark.real_model
def test_suffix_and_auto_equal_plain_greedy_and_later_items_accept_more():
    from core.benchmark import GAP_BUG, first_difference, top_gap
    from core.models import load_model

    model = load_model("smollm2-135m")
    reqs = _labeling_job(model, 12)
    flat = CostSurface.flat()
    alone = Engine(model, draft="none", surface=flat, batch_size=1)
    want = [alone.generate(p, q).tokens for p, q in reqs]
    for spec in ("suffix", "auto"):
        got = Engine(model, draft=spec, surface=flat, batch_size=1).generate_many(reqs)
        assert [g.tokens for g in got] == want, spec  # one row at a time: exactly plain greedy
    # batched: rows equal their single-row output or first differ at a near-tie
    # every step drafts (no plain steps chosen by wall time): acceptance is what is measured
    engine = Engine(model, draft="suffix", surface=flat, batch_size=4, step_modes=False)
    got = engine.generate_many(reqs)
    for (prompt, _), w, g in zip(reqs, want, got, strict=True):
        if g.tokens != w:
            j = first_difference(g.tokens, w)
            assert top_gap(model, prompt, w[:j]) < GAP_BUG
    mal = [g.speculative["mean_accepted_length"] for g in got]
    first, later = sum(mal[:4]) / 4, sum(mal[-4:]) / 4
    assert later > first + 0.5, mal
    assert all(set(g.speculative["steps_by_drafter"]) <= {"suffix", "none"} for g in got)


def test_calibration_learns_how_often_a_bucket_is_accepted():
    from core.engine.drafters.suffix import Calibration

    cal = Calibration()
    b = cal.bucket(1.0, 1)  # a continuation seen once: trusted less than one seen often
    assert cal.rate(1.0, 1) < cal.rate(1.0, 20) < 1.0
    for _ in range(50):  # three nodes tried, the first two accepted: the third never
        cal.observe([b, b, cal.bucket(0.5, 20)], 2)
    assert cal.rate(1.0, 1) > 0.9 and cal.rate(0.5, 20) < 0.1
    before = cal.tries.sum()
    cal.observe([b, b, b], 0)  # only the first node was verified on its own merit
    assert cal.tries.sum() == before + 1


def test_a_row_that_goes_on_as_its_walk_said_is_not_walked_again(monkeypatch):
    """A walk goes past the tokens asked for; while the row's next tokens are the ones it
    said and enough of it is left (or all there is, where the walk ended at an answer's end),
    the rest is proposed without a new walk. A row that goes elsewhere, or that used up what
    was walked, is walked again."""
    target = SimpleNamespace(
        decode=lambda ids: "".join(map(chr, ids)),
        encode_text=lambda t: [ord(c) for c in t],
        encode_texts=lambda ts: [[ord(c) for c in t] for t in ts],
    )
    drafter = SuffixDrafter(target, Corpora())
    answer = '{"name": "Maria Lopez", "city": "Madrid", "label": "positive"}'
    drafter.corpora.get("job").add(answer)
    walks = []
    walk = SuffixIndex.walk
    monkeypatch.setattr(SuffixIndex, "walk", lambda self, q, n: walks.append(q) or walk(self, q, n))
    seq = Sequence(prompt=[1], params=GenerationParams(), max_tokens=200, seed=0)
    seq.corpus, seq.output = "job", target.encode_text('{"name": "M')
    drafter.admit(seq)

    def propose(k=8):
        draft = drafter.propose([seq], [k])
        assert all(0 < c <= 1 for c in draft.chances[0])
        return target.decode(draft.host_tokens(0))

    assert propose() == "aria Lop" and len(walks) == 1
    seq.output += target.encode_text("aria")  # three accepted and the target's next
    assert propose() == ' Lopez",' and len(walks) == 1  # what was walked goes on
    seq.output += target.encode_text(" Lopez")
    assert propose() == '", "city' and len(walks) == 1
    seq.output += target.encode_text("'")  # not what the walk said
    assert propose() == "" and len(walks) == 2
    seq.output = target.encode_text('{"name": "Maria Lopez", "city": "Madrid", "la')
    assert propose() == 'bel": "p' and len(walks) == 3  # a new walk from where the row is
    seq.output += target.encode_text('bel": "positi')
    assert propose(k=8) == 've"}' and len(walks) == 3  # all there is: that walk ended at an end
    seq.output += target.encode_text('ve"}')
    assert propose(k=8) == "" and len(walks) == 4  # nothing left of it: walked again


def test_rows_that_ask_alike_in_one_step_share_one_walk(monkeypatch):
    """Rows whose queries end alike (the walk reads the last MAX_MATCH characters) at the same
    length get one walk in a step, and each the proposal its own walk would give; a row
    that asks otherwise is walked for itself, and the next step walks again."""
    target = SimpleNamespace(
        decode=lambda ids: "".join(map(chr, ids)),
        encode_text=lambda t: [ord(c) for c in t],
        encode_texts=lambda ts: [[ord(c) for c in t] for t in ts],
    )

    def drafter():
        d = SuffixDrafter(target, Corpora())
        for a in ('{"label": "positive", "city": "Rome"}', '{"label": "negative", "city": "Oslo"}'):
            d.corpora.get("job").add(a)
        return d

    walks = []
    walk = SuffixIndex.walk
    monkeypatch.setattr(SuffixIndex, "walk", lambda self, q, n: walks.append(q) or walk(self, q, n))
    far = "x" * MAX_MATCH  # rows 2 and 3 differ only further back than a walk reads
    texts = ['{"label": "pos'] * 2 + [c + far + '{"label": "pos' for c in "yz"]
    texts.append('{"label": "neg')

    def rows(d):
        out = []
        for i, t in enumerate(texts):
            s = Sequence(prompt=[1], params=GenerationParams(), max_tokens=200, seed=i)
            s.corpus, s.output = "job", target.encode_text(t)
            d.admit(s)
            out.append(s)
        return out

    together = drafter()
    seqs = rows(together)
    draft = together.propose(seqs, [6] * len(seqs))
    assert len(walks) == 3  # rows 0 and 1 share one, rows 2 and 3 another
    got = [target.decode(draft.host_tokens(i)) for i in range(len(seqs))]
    assert got == ['itive"'] * 4 + ['ative"']
    alone = []
    for i in range(len(texts)):  # each row proposed on its own, in a drafter of its own
        d = drafter()
        s = rows(d)[i]
        alone.append(target.decode(d.propose([s], [6]).host_tokens(0)))
    assert alone == got
    ch = draft.chances
    assert ch[0] == ch[1] and ch[2] == ch[3] and all(0 < c <= 1 for c in ch[0] + ch[2])
    walks.clear()
    for s in seqs:
        s.output += target.encode_text("x")  # not what any walk said: every row walks again
    together.propose(seqs, [6] * len(seqs))
    assert len(walks) == 3
