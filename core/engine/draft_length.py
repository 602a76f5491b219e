"""How many tokens to draft next: fixed k, or adaptive k bounded by the verify-cost curve.

Adaptive: the drafter's acceptance is measured per draft position, h_j = P(token j accepted |
tokens 1..j-1 accepted), not assumed to be one rate for every position: a copy from the
prompt that survives its first token usually survives many more (measured on the repo's
extraction prompts: ~0.5 for the first n-gram token, ~0.8 after it), which a single
geometric rate cannot express. Every step takes the k that maximizes expected tokens per
unit of time, E(k) / (cost(k + 1) + k * draft_cost), with E(k) = 1 + sum_j prod_{i<=j} h_i.
A position is only measured when drafted, so after a fully accepted draft the next one goes
one token deeper than that (grow on full acceptance) while drafting pays at all; early
rejections lower the first positions' rates, so k shrinks; when no k beats plain decoding
nothing is drafted, with a re-probe every few steps so a drafter can earn its way back.

The counts live in `AcceptanceStats`. An engine keeps one per drafter across requests, and
each request starts from its rates as a light prior (`CARRY_WEIGHT` observations per
position): a job's later prompts start from what its earlier ones measured, yet one prompt's
own evidence outweighs it within a few steps (prompt lookup pays on a copy task and not on a
story in the same job).
"""

from __future__ import annotations

from collections.abc import Sequence

from .costs import CostCurve

K_MAX = 16
PROBE_EVERY = 8
CARRY_WEIGHT = 2.0
WARMUP = 2  # proposals at k_init before the cost model may decide (fresh statistics only)


def expected_tokens(k: int, a: float) -> float:
    """Tokens emitted per verify step (bonus included) at per-token acceptance `a`."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def plan(
    expected: Sequence[float], cost: CostCurve, k_max: int = K_MAX, draft_cost: float = 0.0
) -> tuple[int, float]:
    """The k in [0, k_max] with the most expected tokens per unit time, and that rate.

    `expected[k]` is the expected number of tokens one verify step emits when k are drafted;
    `draft_cost` is the cost of drafting one token in units of one plain step. k = 0 (rate
    1.0: plain decoding) when no draft length beats it.
    """
    best, best_rate = 0, 1.0  # plain decoding: 1 token per unit
    for k in range(1, min(k_max, len(expected) - 1) + 1):
        rate = expected[k] / (cost.relative(k + 1) + k * draft_cost)
        if rate > best_rate * 1.0001:
            best, best_rate = k, rate
    return best, best_rate


def best_k(a: float, cost: CostCurve, k_max: int = K_MAX, draft_cost: float = 0.0) -> int:
    """The k of `plan` at one acceptance rate `a` for every position."""
    return plan([expected_tokens(k, a) for k in range(k_max + 1)], cost, k_max, draft_cost)[0]


class AcceptanceStats:
    """Per-position acceptance counts of one drafter, with a prior.

    `hits[j] / tries[j]` estimates h_{j+1}: the chance that draft token j+1 is accepted given
    that tokens 1..j were. Beyond the last prior entry the last one repeats. `max_weight`
    bounds each position's tries: older observations fade (scaled down) so the estimate
    follows a drift in the job's prompts.
    """

    def __init__(
        self,
        prior: Sequence[float] = (0.5, 0.7, 0.8),
        weight: float = 2.0,
        k_max: int = K_MAX,
        max_weight: float = 64.0,
    ):
        self.hits = [weight * (prior[j] if j < len(prior) else prior[-1]) for j in range(k_max)]
        self.tries = [weight] * k_max
        self.max_weight = max_weight
        self.updates = 0

    def rate(self, j: int) -> float:
        """h_{j+1}: acceptance of draft position j (0-based) given the earlier ones."""
        return self.hits[j] / self.tries[j]

    def expected(self) -> list[float]:
        """E(k) for k = 0..k_max: tokens per verify step, bonus included."""
        out, survive = [1.0], 1.0
        for j in range(len(self.hits)):
            survive *= self.rate(j)
            out.append(out[-1] + survive)
        return out

    def as_prior(self, weight: float) -> AcceptanceStats:
        """Fresh statistics whose prior is these rates at `weight` observations per position."""
        out = AcceptanceStats(k_max=len(self.hits), max_weight=self.max_weight)
        out.hits = [weight * self.rate(j) for j in range(len(self.hits))]
        out.tries = [weight] * len(self.hits)
        out.updates = self.updates
        return out

    def observe(self, proposed: int, accepted: int) -> None:
        """One verify step: positions 1..accepted were accepted, position accepted+1 (if
        proposed) was rejected, later ones were never tested."""
        self.updates += 1
        for j in range(min(accepted + 1, proposed, len(self.hits))):
            self.tries[j] += 1.0
            self.hits[j] += 1.0 if j < accepted else 0.0
            if self.tries[j] > self.max_weight:
                scale = self.max_weight / self.tries[j]
                self.tries[j] *= scale
                self.hits[j] *= scale


# Priors by drafter kind: prompt lookup's first token is a coin flip on free-form text; a
# draft model sharing the tokenizer usually agrees (mlx-lm's own speculative decoding takes
# 61-84% of the Qwen 1.5B's tokens from the 0.5B, measured in the issue).
PRIORS = {"ngram": (0.5, 0.7, 0.8), "model": (0.7, 0.75, 0.8), "early-exit": (0.3, 0.5, 0.6)}


class FixedK:
    def __init__(self, k: int):
        self.k = k

    def next(self) -> int:
        return self.k

    def promise(self) -> float:
        return 0.0  # unknown: a fixed length keeps the candidates' order

    def update(self, proposed: int, accepted: int) -> None:
        pass


class AdaptiveK:
    """Adaptive draft length for one drafter, from its per-position acceptance statistics.

    Args:
        cost: the machine's verify-cost curve.
        stats: the drafter's acceptance counts carried across requests by the engine; this
            request observes into them and into its own copy (`as_prior(CARRY_WEIGHT)`),
            from which k is chosen.
        draft_cost: cost of drafting one token, in units of one plain step.
        k_init: the length of the first `WARMUP` proposals while `stats` has no observations
            yet, so a drafter whose prior is pessimistic still gets measured.
    """

    def __init__(
        self,
        cost: CostCurve,
        stats: AcceptanceStats | None = None,
        k_max: int = K_MAX,
        draft_cost: float = 0.0,
        k_init: int = 4,
    ):
        self.cost = cost
        self.carried = stats if stats is not None else AcceptanceStats(k_max=k_max)
        self.stats = self.carried.as_prior(CARRY_WEIGHT) if stats is not None else self.carried
        self.k_max = min(k_max, len(self.stats.hits))
        self.draft_cost = draft_cost
        self.k_init = min(k_init, self.k_max)
        self._idle = 0
        self._grow = 0  # after a fully accepted draft of k tokens: k + 1

    def _plan(self) -> tuple[int, float]:
        return plan(self.stats.expected(), self.cost, self.k_max, self.draft_cost)

    @property
    def cap(self) -> int:
        """The k the cost model picks (0 = drafting does not pay)."""
        return self._plan()[0]

    def promise(self) -> float:
        """Expected tokens per unit of time at the best k (1.0 = no better than plain)."""
        return self._plan()[1]

    def next(self) -> int:
        if self.stats.updates < WARMUP:
            return self.k_init
        k = self.cap
        if k == 0:  # drafting does not pay: probe now and then, never grow from a probe
            self._idle += 1
            return 0 if self._idle % PROBE_EVERY else 1
        return max(k, self._grow)

    def update(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            return
        self._idle = 0
        self._grow = min(proposed + 1, self.k_max) if accepted == proposed else 0
        self.stats.observe(proposed, accepted)
        if self.carried is not self.stats:
            self.carried.observe(proposed, accepted)
