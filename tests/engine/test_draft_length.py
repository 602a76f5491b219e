import pytest

from core.engine.costs import CostCurve
from core.engine.draft_length import PROBE_EVERY, AdaptiveK, best_k, expected_tokens

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


def test_adaptive_grows_on_full_acceptance_and_shrinks_on_rejection():
    pol = AdaptiveK(CostCurve.flat(), k_init=3, prior=0.9)
    assert pol.next() == 3
    pol.update(3, 3)
    assert pol.next() == 4
    pol.update(4, 1)
    assert pol.next() == 2


def test_adaptive_stops_drafting_then_probes():
    pol = AdaptiveK(CPU, prior=0.6)
    for _ in range(20):
        pol.update(pol.next() or 1, 0)
    ks = [pol.next() for _ in range(2 * PROBE_EVERY)]
    assert ks.count(0) == 2 * PROBE_EVERY - 2 and ks.count(1) == 2


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
