import pytest

from core.engine.costs import CostCurve
from core.engine.draft_length import (
    CARRY_WEIGHT,
    PROBE_EVERY,
    WARMUP,
    AcceptanceStats,
    AdaptiveK,
    best_k,
    expected_tokens,
)

CPU = CostCurve((1, 2, 4, 8, 16), (60.0, 70.0, 85.0, 105.0, 110.0))  # shape seen on a CPU


def test_expected_tokens():
    assert expected_tokens(0, 0.5) == 1.0
    assert expected_tokens(3, 1.0) == 4.0
    assert expected_tokens(2, 0.5) == pytest.approx(1.75)


def test_best_k_grows_with_acceptance_and_stops_below_break_even():
    ks = [best_k(a, CPU) for a in (0.05, 0.3, 0.6, 0.9)]
    assert ks[0] == 0  # 5% acceptance never pays for a wider verify
    assert ks == sorted(ks) and ks[-1] > ks[1]
    assert best_k(0.9, CostCurve.flat()) == 16  # free width: draft as much as allowed


def test_draft_cost_lowers_k():
    assert best_k(0.7, CPU, draft_cost=0.4) < best_k(0.7, CPU)


def warmed(prior, cost=CPU, **kw) -> AdaptiveK:
    """A policy past its warm-up, on fresh statistics with `prior`."""
    pol = AdaptiveK(cost, AcceptanceStats(prior), **kw)
    pol.carried.updates = pol.stats.updates = WARMUP
    return pol


def test_warm_up_drafts_k_init_even_under_a_pessimistic_prior():
    pol = AdaptiveK(CPU, AcceptanceStats((0.05,)), k_init=3)
    ks = []
    for _ in range(WARMUP + 1):
        ks.append(pol.next())
        pol.update(ks[-1], 0)
    assert ks[:WARMUP] == [3] * WARMUP and ks[WARMUP] == 0


def test_adaptive_grows_on_full_acceptance_and_shrinks_on_rejection():
    pol = warmed((0.6,))
    k0 = pol.next()
    assert k0 > 0
    for _ in range(6):
        k = pol.next()
        pol.update(k, k)
    grown = pol.next()
    assert grown > k0
    for _ in range(6):
        pol.update(pol.next() or 1, 0)
    assert pol.next() < grown


def test_stats_count_each_position_given_the_earlier_ones():
    st = AcceptanceStats((0.5,), weight=2.0, k_max=4)
    st.observe(4, 1)  # token 1 accepted, token 2 rejected, tokens 3-4 never tested
    assert st.tries == [3.0, 3.0, 2.0, 2.0]
    assert st.hits == [2.0, 1.0, 1.0, 1.0]
    st.observe(2, 2)  # both accepted (the bonus token is not a draft position)
    assert st.tries[:3] == [4.0, 4.0, 2.0] and st.hits[:2] == [3.0, 2.0]
    assert st.expected()[:3] == pytest.approx([1.0, 1.75, 1.75 + 0.75 * 0.5])


def test_copy_like_acceptance_drafts_longer_than_one_rate_would():
    # Copies: first token 50/50, then nearly always right. One overall rate (what a
    # geometric model sees) undersells long drafts; per-position rates do not.
    pol = warmed((0.5, 0.95))
    overall = (0.5 + 0.95) / 2
    assert pol.next() > best_k(overall, CPU)


def test_adaptive_stops_drafting_then_probes():
    pol = warmed((0.6,))
    for _ in range(20):
        pol.update(pol.next() or 1, 0)
    ks = [pol.next() for _ in range(2 * PROBE_EVERY)]
    assert ks.count(0) == 2 * PROBE_EVERY - 2 and ks.count(1) == 2


def test_requests_start_from_the_carried_rates_as_a_light_prior():
    carried = AcceptanceStats((0.5,))
    first = AdaptiveK(CPU, carried)
    for _ in range(30):
        first.update(4, 4)  # a copy task: everything accepted
    second = AdaptiveK(CPU, carried)
    assert second.stats is not carried
    assert second.stats.rate(0) == pytest.approx(carried.rate(0))
    assert second.stats.tries[0] == CARRY_WEIGHT  # its own evidence soon outweighs it
    assert second.next() > AdaptiveK(CPU, AcceptanceStats((0.5,))).cap


def test_old_observations_fade():
    st = AcceptanceStats((0.5,), max_weight=10.0, k_max=1)
    for _ in range(100):
        st.observe(1, 1)
    for _ in range(10):
        st.observe(1, 0)
    assert st.tries[0] == pytest.approx(10.0)
    assert st.rate(0) < 0.5  # recent rejections dominate 100 older acceptances


def test_cost_curve_interpolates_and_extrapolates():
    c = CostCurve((1, 2, 4), (10.0, 12.0, 16.0))
    assert c(1) == 10.0 and c(3) == 14.0 and c(6) == 20.0
    assert c.relative(4) == 1.6


def test_measured_curve_is_positive_and_non_decreasing(make_tiny):
    from core.engine.costs import measure_verify_curve

    c = measure_verify_curve(make_tiny(0).model, widths=(1, 2, 4), context=8, repeats=2)
    assert c.widths == (1, 2, 4)
    assert all(m > 0 for m in c.ms)
    assert list(c.ms) == sorted(c.ms)


def test_a_fully_accepted_draft_is_followed_by_a_deeper_one():
    pol = AdaptiveK(CPU)
    pol.stats = pol.carried = AcceptanceStats((0.5, 0.6), weight=1e4)  # one step: no change
    pol.stats.updates = WARMUP
    k = pol.next()
    pol.update(k, k)
    assert pol.cap == k and pol.next() == k + 1  # position k + 1 gets measured anyway
    pol.update(k + 1, 1)
    assert pol.next() == k  # a rejection ends the growth


def test_accepted_probes_do_not_grow_a_draft_that_does_not_pay():
    # A draft model as slow per token as the target (an H200 at batch 1): even perfect
    # acceptance cannot pay for drafting, so accepted probes must not escalate k.
    pol = warmed((0.95,), cost=CostCurve.flat(), draft_cost=1.2)
    ks = []
    for _ in range(4 * PROBE_EVERY):
        ks.append(pol.next())
        pol.update(ks[-1], ks[-1])
    assert max(ks) == 1 and ks.count(1) == 4
