"""`auto` picks, per step, the candidate that promises the most tokens per unit of time."""

import mlx.core as mx

from core.engine.costs import CostCurve
from core.engine.draft_length import WARMUP, AcceptanceStats, AdaptiveK
from core.engine.drafters.auto import AutoDrafter, Scheduled
from core.engine.drafters.base import Draft
from core.engine.drafters.ngram import NgramDrafter

CPU = CostCurve((1, 2, 4, 8, 16), (60.0, 70.0, 85.0, 105.0, 110.0))


class Constant:
    """A model-like drafter that always proposes 7, 7, 7, ..."""

    name = "constant"

    def begin(self, prompt):
        pass

    def propose(self, history, k, sampler):
        return Draft(tokens=mx.full((1, k), 7, mx.int32), source=self.name)

    def commit(self, draft, num_accepted):
        pass


def candidate(drafter, rate: float, draft_cost: float = 0.0) -> Scheduled:
    stats = AcceptanceStats((rate,), weight=50.0)
    stats.updates = WARMUP
    return Scheduled(drafter, AdaptiveK(CPU, stats, draft_cost=draft_cost))


def auto(ngram_rate: float, model_rate: float) -> AutoDrafter:
    a = AutoDrafter([candidate(NgramDrafter(), ngram_rate), candidate(Constant(), model_rate, 0.2)])
    a.begin([])
    return a


HISTORY = [1, 2, 3, 4, 1, 2]  # (1, 2) occurred before, followed by 3, 4: a match


def test_prompt_lookup_first_when_it_promises_more():
    d = auto(ngram_rate=0.8, model_rate=0.6).step(HISTORY, None)
    assert d.source == "ngram" and d.tokens[0, :2].tolist() == [3, 4]


def test_a_better_model_drafter_wins_over_a_weak_match():
    d = auto(ngram_rate=0.2, model_rate=0.95).step(HISTORY, None)
    assert d.source == "constant" and d.length > 0


def test_a_lookup_miss_falls_through_to_the_model():
    d = auto(ngram_rate=0.9, model_rate=0.7).step([5, 6, 8], None)  # nothing to copy
    assert d.source == "constant"


def test_commit_goes_to_the_drafter_used():
    a = auto(ngram_rate=0.2, model_rate=0.95)
    d = a.step(HISTORY, None)
    ngram, model = (c.policy.stats for c in a.candidates)
    before = model.tries[0], ngram.tries[0]
    a.commit(d, 0)
    assert (model.tries[0], ngram.tries[0]) == (before[0] + 1, before[1])
