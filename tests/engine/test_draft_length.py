"""Per-position acceptance statistics, and the batch-wide choice of each row's draft length
from them and the machine's cost surface."""

import numpy as np
import pytest

from core.engine.costs import CostSurface
from core.engine.draft_length import (
    CARRY_WEIGHT,
    PROBE_EVERY,
    WARMUP,
    AcceptanceStats,
    Offer,
    RowPolicy,
    allocate,
    chain_speedups,
    expected_tokens,
    gate,
    token_cost,
)

BATCHES, WIDTHS = (1, 8, 64), (1, 2, 4, 8)
# Shapes seen on the 2-core CPU: width nearly free at batch 1, linear in tokens at 64.
CPU = CostSurface(
    BATCHES, WIDTHS, ((90, 100, 130, 200), (140, 250, 460, 840), (600, 1200, 2400, 4800))
)
FLAT = CostSurface.flat()


def chain(rate, n=8):
    return Offer(np.cumprod([rate] * n))


def test_expected_tokens():
    assert expected_tokens(0, 0.5) == 1.0
    assert expected_tokens(3, 1.0) == 4.0
    assert expected_tokens(2, 0.5) == pytest.approx(1.75)


def test_chain_speedups_price_each_length_by_its_acceptance_and_costs():
    """A chain's expected tokens (1 + the gains of its positions) over its cost (the verify
    at its width + each draft token's): where width is free, the length whose next token's
    gain stops paying for its draft cost; on the CPU surface at 64 rows none pays."""
    gains = [0.9, 0.81, 0.05]
    s = chain_speedups(gains, 0.1)
    assert s == pytest.approx([1.0, 1.9 / 1.1, 2.71 / 1.2, 2.76 / 1.3])
    assert int(np.argmax(s)) == 2
    assert int(np.argmax(chain_speedups(gains, 0.0))) == 3
    assert int(np.argmax(chain_speedups(gains, 0.01, CPU.verify_cost(64)))) == 0
    assert chain_speedups(gains, 0.01, CPU.verify_cost(1))[1] == pytest.approx(1.9 / 1.121, 1e-3)


def test_free_width_drafts_every_offered_token():
    assert allocate([chain(0.3, 5), chain(0.9, 3)], FLAT) == [5, 3]


def test_drafting_stops_where_it_does_not_pay():
    # at batch 64 one more token per row costs one more plain step: 0.9 does not pay it
    assert allocate([chain(0.9)] * 64, CPU) == [0] * 64
    # alone, a wider verify is nearly free: a good row drafts, a bad one less or not at all
    good, bad = allocate([chain(0.9)], CPU), allocate([chain(0.05)], CPU)
    assert good[0] >= 4 and bad[0] == 0


def test_rows_with_better_drafts_get_more_tokens():
    ks = allocate([chain(0.95), chain(0.6), chain(0.2), Offer(np.zeros(0))], CPU)
    assert ks[0] >= ks[1] >= ks[2] and ks[3] == 0
    assert ks[0] > ks[2]


def test_forced_tokens_are_drafted_whatever_the_cost():
    ks = allocate([Offer(np.cumprod([0.01] * 4), forced=3)] * 8, CPU)
    assert ks == [3] * 8


def test_a_model_drafters_steps_cost_time():
    offers = [Offer(np.cumprod([0.8] * 8), group="model")] * 8
    free = allocate(offers, FLAT, {"model": 0.0})
    costly = allocate(offers, FLAT, {"model": 0.5})
    assert sum(free) > sum(costly)


def test_old_observations_fade():
    st = AcceptanceStats((0.5,), max_weight=10.0, k_max=1)
    for _ in range(100):
        st.observe(1, 1)
    for _ in range(10):
        st.observe(1, 0)
    assert st.tries[0] == pytest.approx(10.0)
    assert st.rate(0) < 0.5  # recent rejections dominate 100 older acceptances


def test_positions_are_measured_separately():
    st = AcceptanceStats((0.5,), weight=1.0)
    for _ in range(50):
        st.observe(4, 4 if _ % 2 else 0)  # half the drafts fail at once, half copy through
    assert st.rate(0) == pytest.approx(0.5, abs=0.05)
    assert st.rate(1) > 0.9  # once the first token holds, the copy holds
    gains = st.gains(4)
    assert list(gains) == sorted(gains, reverse=True)


def test_a_row_starts_from_the_carried_rates_lightly():
    carried = AcceptanceStats((0.5,))
    for _ in range(40):
        carried.observe(3, 3)
    row = RowPolicy(carried)
    assert row.stats.rate(0) == pytest.approx(carried.rate(0))
    assert row.stats.tries[0] == CARRY_WEIGHT
    row.observe(3, 0)  # the row's own evidence moves it at once
    assert row.stats.rate(0) < carried.rate(0) - 0.2
    assert not row.warming()  # the carried statistics were past their warm-up


def test_probes_come_due_when_a_drafter_stays_idle():
    row = RowPolicy(AcceptanceStats((0.05,)))
    assert row.warming()
    for _ in range(WARMUP):
        row.observe(4, 0)
    assert not row.warming()
    for _ in range(PROBE_EVERY):
        assert not row.probe_due()
        row.observe(0, 0)
    assert row.probe_due()
    row.observe(1, 0)
    assert not row.probe_due()


def _run(m, rates: dict[str, float], steps: int, rows: int | None = None) -> list[str]:
    """`steps` steps of whichever mode `m` picks (1 s each, emitting `rates[mode]`)."""
    seen = []
    for _ in range(steps):
        seen.append(m.mode)
        m.observe(m.mode, rates[m.mode], 1.0, rows)
    return seen


def test_step_modes_try_both_then_keep_the_faster_and_retry():
    from core.engine.step_modes import StepModes

    m = StepModes()
    B, T = m.tuning.block, m.tuning.trial
    close = {"draft": 25, "plain": 30}
    # a trial alternates blocks of each kind until both ran TRIAL steps
    seen = _run(m, close, 2 * T)
    assert seen == (["draft"] * B + ["plain"] * B) * (T // B)
    assert m.mode == "plain" and m.rate == {"draft": 25.0, "plain": 30.0}
    assert _run(m, close, m.tuning.retry) == ["plain"] * m.tuning.retry
    # time to re-measure: plain first, then drafting, which pays now (the rows copy more)
    seen = _run(m, {"draft": 40, "plain": 30}, 2 * T)
    assert seen == (["plain"] * B + ["draft"] * B) * (T // B)
    # the rates are pooled: drafting's 40 now with half the weight of its 25 before, plain's
    # 30 in this trial and in the RETRY steps it ran between the two
    assert m.mode == "draft" and m.rate == {"draft": (4 * 25 + 8 * 40) / 12, "plain": 30.0}
    # each trial is kept: every kind's steps, tokens and seconds, and the kind it picked
    (first, won1), (second, won2) = m.trials
    assert (won1, won2) == ("plain", "draft")
    assert [first[k][0] for k in ("draft", "plain")] == [T, T]
    assert second["draft"][1] / second["draft"][2] == pytest.approx(40.0)


def test_a_clear_loser_ends_the_trial_after_one_block_of_each():
    from core.engine.step_modes import StepModes

    m = StepModes()
    B = m.tuning.block
    slow_draft = {"draft": 10, "plain": 30}  # CLEAR times slower and more
    seen = _run(m, slow_draft, 2 * B)  # one block of each kind, not TRIAL of each
    assert seen == ["draft"] * B + ["plain"] * B
    assert m.mode == "plain" and m.rate == {"draft": 10.0, "plain": 30.0}
    assert _run(m, slow_draft, m.tuning.retry) == ["plain"] * m.tuning.retry
    seen = _run(m, {"draft": 70, "plain": 30}, 2 * B)  # drafting pays now: clearly
    assert seen == ["plain"] * B + ["draft"] * B and m.mode == "draft"


def test_trials_that_keep_picking_the_same_kind_come_ever_more_rarely():
    from core.engine.step_modes import StepModes

    m = StepModes()
    B, R = m.tuning.block, m.tuning.retry
    seen = _run(m, {"draft": 10, "plain": 30}, 1600)  # drafting loses every trial, clearly
    starts = [i for i, x in enumerate(seen) if x == "draft" and (i == 0 or seen[i - 1] == "plain")]
    # The first trial drafts first, a block; later ones run a plain block, then drafting
    # PROBE steps (it lost clearly: it leaves again after those), after RETRY, 2 x RETRY,
    # ... plain steps, up to RETRY_MAX.
    P = m.tuning.probe
    want, end = [0], 2 * B
    for retry in (R, 2 * R, 4 * R, m.tuning.retry_max, m.tuning.retry_max):
        want.append(end + retry + B)
        end = want[-1] + P
    assert starts == want
    assert seen[:B] == ["draft"] * B and seen.count("draft") == B + P * (len(starts) - 1)
    # A trial that picks the other kind starts again from RETRY.
    _run(m, {"draft": 70, "plain": 30}, 2000)
    assert m.mode == "draft" and m._retry > R
    steps = 0
    while m.mode == "draft" and steps < 2 * m.tuning.retry_max:
        _run(m, {"draft": 10, "plain": 30}, 1)
        steps += 1
    if m._trial is not None:  # the plain block of that trial: then it ends
        _run(m, {"draft": 10, "plain": 30}, B)
    assert m.mode == "plain" and m._trial is None and m._retry == R


def test_step_modes_try_again_when_the_live_rows_halve():
    from core.engine.step_modes import StepModes

    m = StepModes()
    _run(m, {"draft": 10, "plain": 30}, 2 * m.tuning.trial, rows=64)
    assert m.mode == "plain"
    assert _run(m, {"draft": 10, "plain": 30}, 5, rows=40) == ["plain"] * 5  # no new trial
    # a step that leaves no row live (between requests, at batch 1) is no change either
    assert _run(m, {"draft": 10, "plain": 30}, 1, rows=0) == ["plain"]
    assert _run(m, {"draft": 10, "plain": 30}, 5, rows=64) == ["plain"] * 5
    # the job's tail: 32 rows of 64 left, and drafting pays there
    _run(m, {"draft": 10, "plain": 30}, 1, rows=32)
    _run(m, {"draft": 50, "plain": 30}, 2 * m.tuning.trial, rows=32)
    assert m.mode == "draft" and m.rate["draft"] == 50.0


def test_rows_that_halve_start_a_trial_only_where_a_draft_token_changes_price():
    """Where the verify surface prices a draft token the same at the new rows (a GPU's flat
    surface), the rows halving at a job's tail start no trial; where the price has moved by
    PRICE_MOVE or more since the last trial (a CPU's compute-bound surface), they do."""
    from core.engine.step_modes import StepModes

    slow = {"draft": 10, "plain": 30}
    flat = StepModes(price=lambda rows: 0.0)
    _run(flat, slow, 2 * flat.tuning.block, rows=64)
    assert flat.mode == "plain" and flat._trial is None
    assert _run(flat, slow, 20, rows=32) + _run(flat, slow, 20, rows=4) == ["plain"] * 40
    cpu = {64: 0.41, 32: 0.39, 16: 0.34, 8: 0.19}  # this CPU's surface, roughly
    m = StepModes(price=cpu.__getitem__)
    _run(m, slow, 2 * m.tuning.block, rows=64)
    assert _run(m, slow, 5, rows=32) + _run(m, slow, 5, rows=16) == ["plain"] * 10
    _run(m, slow, 1, rows=8)  # 0.19 against 0.41 at the last trial: a new one
    assert m._trial is not None and set(m._trial) == {"draft", "plain"}


def test_what_the_drafters_learned_is_tried_against_the_kind_that_runs_alone():
    """A trial started by the drafters' evidence doubling is between drafting and the kind
    that runs: the loop's and plain steps' rates do not depend on a suffix index, so plain
    steps are not tried again there. Drafting, clearly slower in the last trial, probes."""
    from core.engine.step_modes import StepModes

    m = StepModes(("draft", "loop", "plain"))
    B, P = m.tuning.block, m.tuning.probe
    slow = {"draft": 10, "loop": 40, "plain": 30}
    seen = []
    for _ in range(3 * B + 2 * B + 3):
        seen.append(m.mode)
        m.observe(m.mode, slow[m.mode], 1.0, 64, 0)
    assert m.mode == "loop" and seen[-3:] == ["loop"] * 3
    kept = list(m._pool["loop"])
    m.observe("loop", 40, 1.0, 64, m.tuning.evidence)  # the index holds EVIDENCE answers
    assert m._trial is not None and set(m._trial) == {"loop", "draft"}
    # drafting is measured anew; the loop's steps so far still count
    assert m._pool["draft"] == [0.0, 0.0] and m._pool["loop"] == [kept[0] + 40, kept[1] + 1.0]
    seen = []
    for _ in range(B + P + 4):
        seen.append(m.mode)
        m.observe(m.mode, slow[m.mode], 1.0, 64, m.tuning.evidence)
    assert seen == ["loop"] * B + ["draft"] * P + ["loop"] * 4
    assert m._trial is None and m.mode == "loop" and m.steps["plain"] == 2 * B
    assert m.rate["plain"] == 30.0  # from the full trial, kept


def test_step_modes_try_again_each_time_the_drafters_evidence_doubles():
    """A job's first wave drafts from an empty suffix index and loses; once the index holds
    `EVIDENCE` answers, and again each time that doubles, drafting is measured anew."""
    from core.engine.step_modes import StepModes

    m = StepModes()
    slow, fast = {"draft": 10, "plain": 30}, {"draft": 70, "plain": 30}

    def run(rates, steps, evidence):
        seen = []
        for _ in range(steps):
            seen.append(m.mode)
            m.observe(m.mode, rates[m.mode], 1.0, 64, evidence)
        return seen

    run(slow, 2 * m.tuning.block, 0)  # the first trial: drafting loses clearly
    assert m.mode == "plain"
    assert run(slow, 5, m.tuning.evidence - 1) == ["plain"] * 5  # not enough learned yet
    run(slow, 1, m.tuning.evidence)  # enough: a new trial, where drafting still loses (a probe)
    B, P = m.tuning.block, m.tuning.probe
    assert run(slow, 2 * B, m.tuning.evidence) == ["plain"] * B + ["draft"] * P + ["plain"] * (
        B - P
    )
    assert m.mode == "plain"
    assert run(slow, 5, 2 * m.tuning.evidence - 1) == ["plain"] * 5  # under twice: no trial
    run(slow, 1, 2 * m.tuning.evidence)  # twice what it was at the last trial: now drafting wins
    assert (
        run(fast, 2 * m.tuning.block, 2 * m.tuning.evidence)
        == ["plain"] * m.tuning.block + ["draft"] * m.tuning.block
    )
    assert m.mode == "draft"
    assert run(fast, 5, 8 * m.tuning.evidence) == ["draft"] * 5  # drafting already: no trial
    assert m._trial is None


def test_three_kinds_take_turns_and_a_clear_loser_leaves_the_trial():
    """With the resident loop as a third kind: blocks of each in turn until each ran TRIAL
    steps; a kind CLEAR times slower than the fastest, once every kind ran a block, runs
    no more of that trial."""
    from core.engine.step_modes import StepModes

    kinds = ("draft", "loop", "plain")
    m = StepModes(kinds)
    B, T = m.tuning.block, m.tuning.trial
    seen = _run(m, {"draft": 25, "loop": 40, "plain": 30}, 3 * T)
    assert seen == (["draft"] * B + ["loop"] * B + ["plain"] * B) * (T // B)
    assert m.mode == "loop" and m._trial is None
    m = StepModes(kinds)
    seen = _run(m, {"draft": 10, "loop": 40, "plain": 30}, 3 * B + 2 * (T - B))
    assert seen == ["draft"] * B + ["loop"] * B + ["plain"] * B + ["loop"] * B + ["plain"] * B
    assert m.mode == "loop" and m._trial is None and m.rate["draft"] == 10.0
    # the next trial starts with the kind that runs, then the others in turn; drafting,
    # which left the last one clearly slower, runs PROBE steps and leaves again
    _run(m, {"draft": 10, "loop": 40, "plain": 30}, m.tuning.retry)
    P = m.tuning.probe
    seen = _run(m, {"draft": 10, "loop": 40, "plain": 30}, 3 * B + P)
    assert seen == ["loop"] * B + ["plain"] * B + ["draft"] * P + ["loop"] * B
    assert m._out == {"draft"} and m._trial is not None  # loop and plain: TRIAL steps each
    assert _run(m, {"draft": 10, "loop": 40, "plain": 30}, B) == ["plain"] * B
    assert m.mode == "loop" and m._trial is None
    # a probe that finds the kind no longer clearly slower: it runs its blocks in turn
    _run(m, {"draft": 10, "loop": 40, "plain": 30}, 2 * m.tuning.retry)
    close = {"draft": 35, "loop": 40, "plain": 30}
    seen = _run(m, close, 2 * T + T)
    assert seen == (
        ["loop"] * B
        + ["plain"] * B
        + ["draft"] * P
        + ["loop"] * B
        + ["plain"] * B
        + ["draft"] * B
        + ["draft"] * (T - P - B)
    )
    # drafting's pooled rate: 8 steps at 35 now, its earlier 5 steps at 10 decayed twice
    # and once
    assert m.mode == "loop" and m._trial is None
    assert m.rate["draft"] == pytest.approx((8 * 35 + 0.25 * 40 + 0.5 * 10) / (8 + 1 + 0.5))


def test_one_unlucky_trial_does_not_hand_the_batch_to_the_slower_kind():
    """What the winner measured while it ran and what earlier trials measured count beside a
    trial's few steps: a short block that happened to emit little (a chain rejected three
    times, a prompt's prefill landing in it) does not turn the batch over to a kind that is
    slower on the whole; a kind that stays faster in the trials still wins them; and a change
    of rows forgets what was measured before."""
    from core.engine.step_modes import StepModes

    kinds = ("draft", "loop")
    m = StepModes(kinds, price=lambda rows: 10 / rows)
    fast = {"draft": 30, "loop": 45}
    _run(m, fast, 2 * m.tuning.trial + m.tuning.retry)  # loop won its trial and ran RETRY steps
    assert m.mode == "loop" and m._trial is not None
    unlucky = {"draft": 30, "loop": 25}  # this trial's loop blocks emit little
    seen = _run(m, unlucky, 2 * m.tuning.trial)
    assert seen.count("loop") == seen.count("draft") == m.tuning.trial
    assert m.mode == "loop" and m.rate["loop"] > m.rate["draft"] == 30.0
    # the loop stays slower: after a trial or two drafting wins
    for _ in range(3):
        if m.mode == "draft":
            break
        _run(m, unlucky, m._retry + 2 * m.tuning.trial)
    assert m.mode == "draft"
    # the rows halve where a draft token's price moves: the trial starts from nothing
    m = StepModes(kinds, price=lambda rows: 10 / rows)
    _run(m, fast, 2 * m.tuning.trial + 1, rows=64)
    _run(m, fast, 1, rows=16)
    assert m._trial is not None and m._pool == {k: [0.0, 0.0] for k in kinds}
    _run(m, unlucky, 2 * m.tuning.trial, rows=16)
    assert m.mode == "draft" and m.rate == {"draft": 30.0, "loop": 25.0}


def test_work_a_later_step_reads_is_credited_to_the_kind_that_computed_it():
    """A double-buffered kind's step is read by the next step: the loop's first step of a
    block emits nothing, and the next kind's first step reads its last. Credited to the
    loop (the seconds waited and the tokens), the loop's 40 tokens a step win over
    drafting's 30; counted where they were read, drafting would have looked faster."""
    from core.engine.step_modes import StepModes

    def trial(credit: bool) -> StepModes:
        m = StepModes(("draft", "loop"))
        lag = 0  # the loop's tokens in flight
        while m._trial is not None:
            if m.mode == "draft":
                if lag and credit:
                    m.credit("loop", lag, 1.0)
                    m.observe("draft", 30, 1.0)
                else:  # the step that read the loop's last one took its tokens and wait
                    m.observe("draft", 30 + lag, 2.0 if lag else 1.0)
                lag = 0
            else:
                m.observe("loop", lag, 1.0)
                lag = 40
        return m

    assert trial(credit=True).mode == "loop"
    assert trial(credit=False).mode == "draft"


def test_a_double_buffered_kinds_entry_measures_nothing_in_a_trial():
    """The loop's first step of a block queues its first step and drafts its first chain
    host-synced, reading nothing of its own: 6 s for no tokens here, where its later steps
    emit 40 tokens a second and drafting's 30. Counted, that entry makes every loop block
    look slower than drafting, and a one-step probe (the entry alone) can never win back;
    not counted, the loop wins its first trial and keeps winning. Outside a trial an entry
    still counts (a row joining makes the loop leave and enter again as it runs)."""
    from core.engine.step_modes import StepModes

    def run(flag: bool, steps: int) -> StepModes:
        m = StepModes(("draft", "loop"))
        last = None
        for _ in range(steps):
            mode = m.mode
            entry = mode == "loop" and last != "loop"
            tokens, seconds = (0, 6.0) if entry else ((40, 1.0) if mode == "loop" else (30, 1.0))
            m.observe(mode, tokens, seconds, entry=flag and entry)
            last = mode
        return m

    counted = run(False, 3000)
    assert counted.mode == "draft" and len(counted.trials) >= 4
    assert all(won == "draft" for _, won in counted.trials)
    flagged = run(True, 3000)
    assert flagged.mode == "loop" and len(flagged.trials) >= 4
    assert all(won == "loop" for _, won in flagged.trials)
    first, _ = flagged.trials[0]
    assert first["loop"][0] == flagged.tuning.trial and first["loop"][1] / first["loop"][2] == 40.0
    # a step outside a trial counts, entry or not
    m = flagged
    while m._trial is not None:
        m.observe(m.mode, 40, 1.0)
    before = list(m._pool["loop"])
    m.observe("loop", 0, 6.0, entry=True)
    assert m._pool["loop"] == [before[0], before[1] + 6.0]


class StepClock:
    """The step modes' clock in a test: every reading is one millisecond after the last, so
    each step costs the same few readings, whatever the machine. With `slow` (a step's
    report -> extra seconds) and the `batch` it times, the first reading that finds the
    running step's report asking for more adds it once."""

    def __init__(self, slow=None):
        self.now = 0.0
        self.slow = slow
        self.batch = None
        self._charged = None

    def __call__(self) -> float:
        self.now += 0.001
        report = self.batch.report if self.batch is not None else None
        if self.slow and report is not None and report is not self._charged:
            extra = self.slow(report)
            if extra:
                self.now += extra
                self._charged = report
        return self.now


def test_a_batch_whose_drafting_steps_are_slower_decodes_plain_and_loses_nothing(make_tiny):
    """Drafting steps made slow on the host (100 ms on the step modes' clock, where a step
    costs a few ms: a drafting step of this tiny model on these repetitive prompts emits up
    to ~8 tokens per row): after trying both kinds of step the batch runs plain steps, and
    every row is still its plain greedy output."""
    clock = StepClock(
        slow=lambda r: 0.1 if r.runner == "synced" and r.decoding and "draft" in r.phases else 0
    )
    batch = _ngram_batch_on_repetitive_prompts(make_tiny, clock=clock)
    assert batch.modes.rate["plain"] > batch.modes.rate["draft"]
    # past the trials (both kinds alike), the batch ran plain steps
    assert batch.modes.steps["plain"] > 2 * batch.modes.steps["draft"]


def test_a_draft_token_costs_nothing_on_a_flat_surface_and_most_of_a_plain_one_at_64_rows():
    assert token_cost(FLAT, 64, 128) == pytest.approx(0.0, abs=1e-9)
    assert token_cost(CPU, 1, 2) == pytest.approx((100 - 90) / 90)
    assert token_cost(CPU, 64, 128) == pytest.approx((1200 - 600) / 64 / (600 / 64))
    assert token_cost(CPU, 64, 64) == 0.0


def test_the_gate_keeps_the_nodes_whose_chances_pay_and_the_other_rows_drafts():
    """64 rows on the compute-bound surface: a verified token costs as much as a plain one,
    so a model drafter's row keeps only nodes almost sure to be accepted; a lookup row's
    nodes (not in `chances`) stay as allocated."""
    offers = [chain(0.5) for _ in range(64)]
    ks = [4] * 64
    chances = {r: [0.99, 0.98, 0.5, 0.3] for r in range(32)}  # sure of two, unsure after
    chances.update({r: [0.4, 0.2, 0.1, 0.05] for r in range(32, 48)})  # unsure from the first
    kept = gate(offers, ks, chances, CPU)
    assert kept[:32] == [2] * 32
    assert kept[32:48] == [0] * 16
    assert kept[48:] == [4] * 16
    # On a flat surface every drafted node is worth verifying.
    assert gate(offers, ks, chances, FLAT)[:48] == [4] * 48


def test_a_step_that_only_prefills_measures_no_kind_of_step(make_tiny):
    """A job's first step prefills its whole first wave of prompts, whatever kind of step
    is current (a trial's first block: drafting). Made slow (0.5 s on the step modes' clock
    while prompts are planned), it used to be charged to drafting, which then lost its
    first trial to plain steps on prompts where it emits several tokens a step. Now no kind
    is charged with it: every trial block's seconds are decoding's, and drafting wins."""
    clock = StepClock(slow=lambda r: 0.5 if r.prefill_tokens else 0)
    batch = _ngram_batch_on_repetitive_prompts(make_tiny, clock=clock)
    first, won = batch.modes.trials[0]
    assert all(seconds < 0.5 for _, _, seconds in first.values())  # no block held the prompts
    assert won == "draft"


@pytest.mark.parametrize("ahead", [True, False])
def test_a_plain_block_begins_with_an_entry_and_only_there(make_tiny, ahead):
    """In a real batch the first plain step after a drafting step queues a step with none of
    its own to read: where the device runs ahead of the host, that one, and no other, is
    told to the step modes as an entry; no drafting step ever is (each reads its own). On
    the CPU, where queueing a step computes it, none is."""
    from core.engine.config import ModeTuning

    seen = []  # the steps the step modes measure (those with decoding rows), as told to them

    def told(r):
        if r.decoding:
            seen.append((r.kind, r.entry and ahead))

    _ngram_batch_on_repetitive_prompts(
        make_tiny,
        runs_ahead=ahead,
        observers=[told],
        modes=ModeTuning(retry=8, retry_max=8),  # trials often: many switches of kind
    )
    modes = [m for m, _ in seen]
    firsts = [i for i, m in enumerate(modes) if m == "plain" and i > 0 and modes[i - 1] == "draft"]
    assert len(firsts) >= 1  # the first trial's plain block; later switches follow timing
    assert all(seen[i][1] for i in firsts) if ahead else not any(seen[i][1] for i in firsts)
    assert not any(e for i, (m, e) in enumerate(seen) if i not in firsts and i > 0)


def _ngram_batch_on_repetitive_prompts(make_tiny, **kw):
    """Three repetitive prompts through one `ngram` batch of a tiny model on a flat surface
    (a drafting step emits up to ~8 tokens a row there), after the test's patches; each
    row's output is asserted to be its plain greedy one. The batch, run."""
    from core.engine import CostSurface, Engine, GenerationParams

    target = make_tiny(3)
    prompts = ["Copy: a b c a b c a b c a b", "1 2 3 1 2 3 1 2", "x y x y x y x"]
    reqs = [(target.encode_prompt(p), GenerationParams(max_tokens=60)) for p in prompts]
    flat = CostSurface.flat()
    engine = Engine(target, draft="ngram", surface=flat, batch_size=3, **kw)
    batch = engine.new_batch()
    if isinstance(kw.get("clock"), StepClock):
        kw["clock"].batch = batch
    for i, (p, q) in enumerate(reqs):
        batch.submit(p, q, tag=i)
    got = {r.tag: r for r in batch.run()}
    want = Engine(target, draft="none", surface=flat, batch_size=3).generate_many(reqs)
    assert [got[i].tokens for i in range(3)] == [r.tokens for r in want]
    return batch
