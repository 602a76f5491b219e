"""How many tokens to draft next: fixed k, or adaptive k bounded by the verify-cost curve.

Adaptive: grow by one after full acceptance, shrink to one past the accepted length after a
rejection, and never beyond the k that maximizes expected tokens per unit of verify time,
E(k) / cost(k + 1) with E(k) = (1 - a^(k+1)) / (1 - a) and `a` the running per-token
acceptance. When even the best k is expected to be slower than plain decoding, draft nothing
(re-probing every few steps so a drafter can earn its way back).
"""

from __future__ import annotations

from .costs import CostCurve

K_MAX = 16
PROBE_EVERY = 8


def expected_tokens(k: int, a: float) -> float:
    """Tokens emitted per verify step (bonus included) at per-token acceptance `a`."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def best_k(a: float, cost: CostCurve, k_max: int = K_MAX, draft_cost: float = 0.0) -> int:
    """The k in [0, k_max] with the most expected tokens per unit time (0 = don't draft).

    `draft_cost` is the cost of drafting one token in units of one plain step.
    """
    best, best_rate = 0, 1.0  # plain decoding: 1 token per unit
    for k in range(1, k_max + 1):
        rate = expected_tokens(k, a) / (cost.relative(k + 1) + k * draft_cost)
        if rate > best_rate * 1.0001:
            best, best_rate = k, rate
    return best


class FixedK:
    def __init__(self, k: int):
        self.k = k

    def next(self) -> int:
        return self.k

    def update(self, proposed: int, accepted: int) -> None:
        pass


class AdaptiveK:
    """Per-request adaptive draft length for one drafter."""

    def __init__(
        self,
        cost: CostCurve,
        k_init: int = 4,
        k_max: int = K_MAX,
        prior: float = 0.6,
        draft_cost: float = 0.0,
        smoothing: float = 0.3,
    ):
        self.cost = cost
        self.k = k_init
        self.k_max = k_max
        self.rate = prior  # running per-token acceptance estimate
        self.draft_cost = draft_cost
        self.smoothing = smoothing
        self._idle = 0

    @property
    def cap(self) -> int:
        return best_k(self.rate, self.cost, self.k_max, self.draft_cost)

    def next(self) -> int:
        cap = self.cap
        if cap == 0:
            self._idle += 1
            if self._idle % PROBE_EVERY:
                return 0
            return 1  # probe
        return max(1, min(self.k, cap))

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self._idle = 0
        # Per-token acceptance from a truncated geometric run: accepted successes, and one
        # failure unless all were accepted.
        trials = accepted + (accepted < proposed)
        obs = accepted / trials if trials else 0.0
        self.rate += self.smoothing * (obs - self.rate)
        self.k = min(self.k + 1, self.k_max) if accepted == proposed else max(1, accepted + 1)
