"""How many tokens each row of a batch drafts next, from measured acceptance and cost.

Acceptance is measured per drafter and per draft position, h_j = P(token j accepted | tokens
1..j-1 accepted), not assumed to be one rate for every position: a copy from the prompt that
survives its first token usually survives many more (~0.5 for the first n-gram token, ~0.8
after it on extraction prompts), which one geometric rate cannot express. Drafting token j
of a row then gains prod_{i<=j} h_i expected tokens.

A batch step costs C(B, T): the measured surface at B rows and T tokens in all (costs.py),
plus each model drafter's sequential steps. `allocate` takes the draft tokens of all rows
in order of their gain and keeps the prefix with the most expected tokens per unit of
time, so rows speculate only where the gain beats the cost at this batch size and the
others verify one token. A position is only measured when drafted; beyond the measured ones
the prior's last rate stands in (optimistic enough to try one deeper). When nothing pays, a
row re-probes with one token every `PROBE_EVERY` steps so a drafter can earn its way back;
fresh statistics get `WARMUP` proposals at `K_INIT` before the cost model decides, unless
the drafter's rates were measured offline (`Drafter.prior`: a calibrated self-drafter's
held-out agreement), which then stand in for the guessed prior.

A model drafter that can say how sure it is of each node (a `chances` method, drafters/base.py)
is asked once its drafts are made, where verifying a token costs real time (`token_cost` at
least `GATE_COST`): `gate` then keeps the nodes whose chances pay at the batch's cost.

An engine keeps one `AcceptanceStats` per drafter across requests; each request starts from
its rates as a light prior (`CARRY_WEIGHT` observations per position), so a job's later
prompts start from what its earlier ones measured, yet one prompt's own evidence outweighs
it within a few steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .costs import CostSurface

K_MAX = 16
PROBE_EVERY = 8
CARRY_WEIGHT = 2.0
WARMUP = 2  # proposals at K_INIT before the cost model may decide (fresh statistics only)
K_INIT = 4

# Priors by drafter kind: prompt lookup's first token is a coin flip on free-form text; a
# draft model sharing the tokenizer usually agrees (mlx-lm's own speculative decoding takes
# 61-84% of the Qwen 1.5B's tokens from the 0.5B).
PRIORS = {"ngram": (0.5, 0.7, 0.8), "model": (0.7, 0.75, 0.8), "early-exit": (0.3, 0.5, 0.6)}


def expected_tokens(k: int, a: float) -> float:
    """Tokens emitted per verify step (bonus included) at per-token acceptance `a`."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def chain_speedups(
    gains: Sequence[float],
    draft_cost: float,
    verify_cost: Callable[[int], float] | None = None,
) -> np.ndarray:
    """Expected tokens per unit of time of a chain of k draft tokens a row against plain
    steps, for k = 0 .. len(gains) (k = 0: plain, 1.0): `gains[j]` is the chance that draft
    tokens 1 .. j + 1 are all accepted (`AcceptanceStats.gains`), each draft token costs
    `draft_cost` plain steps and `verify_cost(w)` is a step verifying w tokens per row, in
    plain steps (`CostSurface.verify_cost`; None: 1, a latency-bound accelerator)."""
    costs = np.array(
        [
            (1.0 if verify_cost is None else verify_cost(k + 1)) + k * draft_cost
            for k in range(1, len(gains) + 1)
        ]
    )
    expected = 1.0 + np.cumsum(np.asarray(gains, float))
    return np.concatenate([[1.0], expected / costs])


def best_length(
    a: float,
    draft_cost: float,
    verify_cost: Callable[[int], float] | None = None,
    k_max: int = K_MAX,
) -> tuple[int, float]:
    """The draft length with the most expected tokens per unit of time, and that speedup
    over plain steps, for a model drafter whose tokens are accepted at rate `a` and each cost
    `draft_cost` plain steps (`chain_speedups`). (0, 1.0) when no length pays."""
    speedups = chain_speedups(a ** np.arange(1, k_max + 1), draft_cost, verify_cost)
    k = int(np.argmax(speedups))
    return k, float(speedups[k])


class AcceptanceStats:
    """Per-position acceptance counts of one drafter, with a prior.

    `hits[j] / tries[j]` estimates h_{j+1}: the chance that draft token j+1 is accepted given
    that tokens 1..j were. `max_weight` bounds each position's tries: older observations fade
    (scaled down) so the estimate follows a drift in the job's prompts.
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

    def gains(self, k: int | None = None) -> np.ndarray:
        """(k,) expected tokens gained by drafting position j: prod_{i<=j} h_i."""
        k = len(self.hits) if k is None else min(k, len(self.hits))
        return np.cumprod([self.rate(j) for j in range(k)])

    def expected(self) -> list[float]:
        """E(k) for k = 0..k_max: tokens per verify step, bonus included."""
        return [1.0, *(1.0 + np.cumsum(self.gains())).tolist()]

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


class RowPolicy:
    """One row's statistics for one drafter: its own (seeded from the engine's carried ones)
    and the carried ones it also observes into, plus its probing schedule."""

    def __init__(self, carried: AcceptanceStats):
        self.carried = carried
        self.stats = carried.as_prior(CARRY_WEIGHT)
        self.idle = 0  # steps since this drafter last drafted for the row

    def warming(self) -> bool:
        return self.stats.updates < WARMUP

    def probe_due(self) -> bool:
        return self.idle >= PROBE_EVERY

    def observe(self, proposed: int, accepted: int) -> None:
        if proposed == 0:
            self.idle += 1
            return
        self.idle = 0
        self.stats.observe(proposed, accepted)
        self.carried.observe(proposed, accepted)


@dataclass
class Offer:
    """What one row can draft this step with its chosen drafter.

    Attributes:
        gains: expected tokens gained by each further draft node, in order (decreasing).
        group: the model drafter whose sequential steps it shares (None for lookups).
        forced: nodes drafted whatever the cost (warm-up or probe).
        probe: the forced node is a probe (`RowPolicy.probe_due`): it holds where this
            offer is the row's best, not against a better drafter's (a warm-up does).
    """

    gains: np.ndarray
    group: str | None = None
    forced: int = 0
    probe: bool = False


def allocate(
    offers: list[Offer],
    surface: CostSurface,
    step_costs: dict[str, float] | None = None,
) -> list[int]:
    """Draft nodes per row maximizing expected tokens per unit of time for the whole step.

    Args:
        offers: one per decoding row.
        surface: the verify-cost surface (the step's cost at B rows and T tokens).
        step_costs: per model drafter, one of its drafting steps over its rows, in units of
            one plain target step of this batch.

    Returns:
        ks: nodes to draft per row (never more than its offer).
    """
    B = len(offers)
    if B == 0:
        return []
    step_costs = step_costs or {}
    forced = [min(o.forced, len(o.gains)) for o in offers]
    groups = sorted({o.group for o in offers if o.group is not None})
    gid = {g: i for i, g in enumerate(groups)}
    # Candidate increments beyond the forced ones: (gain, row, depth, group index).
    gain, row, depth, grp = [], [], [], []
    for r, o in enumerate(offers):
        n = len(o.gains) - forced[r]
        if n > 0:
            gain.append(o.gains[forced[r] :])
            row.append(np.full(n, r))
            depth.append(np.arange(forced[r] + 1, len(o.gains) + 1))
            grp.append(np.full(n, gid[o.group] if o.group is not None else -1))
    base_gain = float(sum(o.gains[:f].sum() for o, f in zip(offers, forced, strict=True)))
    base_steps = np.zeros(len(groups))
    for o, f in zip(offers, forced, strict=True):
        if o.group is not None:
            base_steps[gid[o.group]] = max(base_steps[gid[o.group]], f)
    unit = np.array([step_costs.get(g, 0.0) for g in groups])

    at = surface.at(B)
    plain = float(at(np.array([B], float))[0])

    def cost(tokens: np.ndarray, steps: np.ndarray) -> np.ndarray:
        verify = at(tokens.astype(float)) / plain
        return verify + (steps * unit).sum(axis=-1) if len(groups) else verify

    T0 = B + sum(forced)
    best_m, best_rate = 0, (B + base_gain) / cost(np.array([T0]), base_steps[None])[0]
    ks = list(forced)
    if gain:
        g = np.concatenate(gain)
        order = np.argsort(-g, kind="stable")
        rw, dp, gp = (np.concatenate(a)[order] for a in (row, depth, grp))
        g = g[order]
        cum = np.cumsum(g)
        steps = np.repeat(base_steps[None], len(g), axis=0)
        for i, _ in enumerate(groups):
            steps[:, i] = np.maximum(base_steps[i], np.maximum.accumulate(np.where(gp == i, dp, 0)))
        rates = (B + base_gain + cum) / cost(T0 + np.arange(1, len(g) + 1), steps)
        m = int(np.argmax(rates))
        if rates[m] > best_rate * 1.0001:
            best_m = m + 1
        for r in rw[:best_m]:
            ks[r] += 1
    return ks


# A verified draft token costing at least this share of a plain token (a compute-bound step at
# a large batch): the engine asks the drafters that can say how sure they are, and keeps only
# the nodes that pay. Below it, a token is nearly free and the host sync is not worth it.
GATE_COST = 0.15


def token_cost(surface: CostSurface, B: int, T: int) -> float:
    """What each of T - B draft tokens costs to verify beside the B rows' own, in units of one
    row's share of a plain step (0: free, 1: as dear as a plain token)."""
    if T <= B:
        return 0.0
    c = surface.at(B)(np.array([B, T], float))
    return float((c[1] - c[0]) / (T - B) / (c[0] / B))


def gate(
    offers: list[Offer], ks: list[int], chances: dict[int, list[float]], surface: CostSurface
) -> list[int]:
    """The nodes each row verifies once its drafts are made: a row in `chances` (a model
    drafter's calibrated chance of each node being accepted with all before it; drafting it
    is paid for) keeps its forced nodes (a probe: how else would a chance the drafter
    underrates be learned) and the prefix that pays at this batch's cost, the others their
    ks[r]."""
    again = []
    for o, k, ch in zip(offers, ks, (chances.get(r) for r in range(len(ks))), strict=True):
        if ch is None:
            again.append(Offer(np.asarray(o.gains[:k], float), None, forced=k))
        else:
            gains = np.minimum.accumulate(np.asarray(ch[:k], float))
            again.append(Offer(gains, None, forced=min(o.forced, k)))
    return allocate(again, surface)
