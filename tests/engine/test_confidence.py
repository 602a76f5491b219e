"""A drafter's confidence calibrated to acceptance."""

import numpy as np
import pytest

from core.engine.confidence import ProbabilityBins


def test_probability_bins_start_from_the_probability_and_learn_what_is_accepted():
    cal = ProbabilityBins()
    probs = np.array([[0.95, 0.95, 0.45]])
    assert cal.chances(cal.buckets(probs))[0] == pytest.approx([0.95, 0.95**2, 0.95**2 * 0.45])
    sure, unsure = cal.buckets(np.array([0.95, 0.45])).tolist()
    for _ in range(100):  # the head's 0.95 tokens turn out right half the time
        cal.observe([sure, unsure], 0)  # rejected: the node after it is not tested
        cal.observe([sure], 1)
    assert cal.rates()[sure] == pytest.approx(0.5, abs=0.02)
    assert cal.rates()[unsure] == pytest.approx(0.45)  # never tested on its own merit
    assert cal.buckets(np.array([0.0, 1.0])).tolist() == [0, 9]
