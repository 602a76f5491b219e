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

from collections import deque
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


class StepModes:
    """Which kind of step a batch runs, from the measured tokens per second of each kind,
    wall time included. The kinds: host-synced drafting steps (`draft`: each row's drafter
    chosen by its promise), the feature head's loop resident on the device (`loop`,
    resident.py) where the batch can run it, and plain double-buffered steps (`plain`).

    The surface prices the target's forward; the host work around a drafting step (lookups,
    planning, acceptance, bookkeeping) and the double buffering it gives up are not in it,
    and on an accelerator running a small model they can cost more than the forward. So the
    batch tries each kind. A trial runs the kinds in turn, in blocks of `BLOCK` steps, until
    each has run `TRIAL`, so all meet the same rows and the same joining prompts (a job's
    first steps prefill most of its prompts: a trial of one kind alone would charge that to
    it); once every kind has run a block, one `CLEAR` times slower than the fastest leaves
    the trial, which ends when one kind is left. A double-buffered kind's last step (the
    loop's, plain steps') is read by the next kind's first: its tokens and the wait for
    them are credited to the kind that computed them (`credit`). Where the device runs
    ahead of the host (a GPU), such a kind's first step in a block (its entry: the first
    step queued, with nothing of its own to read; the loop's also drafts its first chain
    host-synced) is the host's work alone, the switch's cost, which a trial's alternation
    makes and the winner running on does not pay: it measures nothing in a trial and
    counts toward no block (`observe`'s `entry`; the batch says which steps are entries).
    Counted, it made the loop look slower than it runs: at batch 1 on an H100 a loop block
    of one step (a probe) took 15-29 ms for one or two tokens against 7 ms a step when the
    loop runs on, so once it lost a trial it lost every probe. Outside a trial an entry
    counts: there it follows a row joining or finishing, a cost the kind pays as it runs.
    (On the CPU queueing a step computes most of it: its entry holds its forward and
    counts.) A kind that left the last trial clearly slower runs a first block of `PROBE`
    steps in the next one, not `BLOCK`: it leaves again after that if it is still as slow
    (on an accelerator a host-synced drafting step can cost four plain ones, and on a
    short job the next trials come as its rows finish), and runs its blocks as the others
    do if it is not.

    Then the fastest kind runs, with a new trial after `RETRY` steps (doubling, up to
    `RETRY_MAX`, each time a trial picks the kind the previous one did: a drafter that keeps
    losing costs its trial steps ever more rarely; a change of winner starts again from
    `RETRY`), or as soon as the live rows have halved or doubled since the last trial and
    the price of a draft token at them (`price`: the verify surface's, `token_cost`) has
    moved by `PRICE_MOVE` of a plain token's or more (at a job's tail drafting can pay
    where it did not at a full batch, on a machine whose verify is compute-bound there;
    where the price is flat, an accelerator's, the rows' count changes nothing; a step that
    leaves no row live, between requests at batch 1, is no such change either), or, while
    another kind than `draft` runs, the drafters' evidence (`Drafter.evidence`: a job's
    answers indexed) has reached `EVIDENCE` and doubled since (a job's first wave drafts
    from an empty index; the next one from all that the first wrote). That trial is
    between drafting and the kind that runs: what the drafters learned changes no other.

    A trial's blocks are short (8 steps of a kind at batch 1 take some 40 ms on a GPU, and
    the head's loop emits 1 to 3 tokens a step), so one trial's rates are noisy. So each
    kind's measurement is pooled (`_pool`): the steps the winner runs between trials count
    toward its rate, and what a trial measures adds to what the earlier ones did, weighed
    down by `DECAY` at every trial. The winner is the kind with the best pooled rate among
    those still in the trial. A trial that the rows started (halved or doubled where a draft
    token's price moved) forgets what every kind measured before; one that the drafters'
    evidence started forgets what drafting did.
    """

    TRIAL = 8
    BLOCK = 4
    PROBE = 1
    RETRY = 64
    RETRY_MAX = 512
    CLEAR = 2.0
    EVIDENCE = 8
    PRICE_MOVE = 0.1
    DECAY = 0.5

    def __init__(
        self,
        kinds: tuple[str, ...] = ("draft", "plain"),
        price: Callable[[int], float] | None = None,
    ):
        self.kinds = tuple(kinds)
        self.price = price  # live rows -> a draft token's price (None: the rows alone)
        self.rate: dict[str, float | None] = dict.fromkeys(self.kinds)
        self.mode = self.kinds[0]
        self._lost: set[str] = set()  # kinds that left the last trial they ran in so
        self._out: set[str] = set()  # kinds that left the current trial, clearly slower
        self._block: dict[str, int] = {}  # each kind's first block in the current trial
        self._trial: dict[str, list] | None = None  # steps, tokens, seconds by kind; None: none
        self._start_trial(self.kinds)
        self._since = 0  # steps since the last trial ended
        self._rows: int | None = None  # live rows when it ended
        self._evidence = 0  # the drafters' evidence when it ended
        self._retry = self.RETRY  # steps until the next trial
        self._won: str | None = None  # the kind the last trial picked
        self.steps = dict.fromkeys(self.kinds, 0)  # steps run of each kind
        # The last trials, oldest first: each kind's (steps, tokens, seconds) and the winner.
        self.trials: deque[tuple[dict[str, tuple[int, int, float]], str]] = deque(maxlen=64)
        # Each kind's tokens and seconds measured before the current trial (class docstring).
        self._pool: dict[str, list[float]] = {m: [0.0, 0.0] for m in self.kinds}

    def _start_trial(self, kinds: tuple[str, ...], forget: tuple[str, ...] = ()) -> None:
        """A trial of `kinds`, the current one first, then the others in turn; the kinds in
        `forget` start from nothing (what they measured before no longer holds)."""
        for m in forget:
            self._pool[m] = [0.0, 0.0]
        self._trial = {m: [0, 0, 0.0] for m in self.kinds if m in kinds}
        self._block = {m: self.PROBE if m in self._lost else self.BLOCK for m in kinds}
        self._out = set()

    def _moved(self, rows: int | None) -> bool:
        """Whether the live rows changed enough since the last trial to try again."""
        if not rows or not self._rows or self._rows < 2 * rows < 4 * self._rows:
            return False  # (no rows live: between requests, as at batch 1; not a change)
        return (
            self.price is None or abs(self.price(rows) - self.price(self._rows)) >= self.PRICE_MOVE
        )

    def credit(self, mode: str, tokens: int, seconds: float) -> None:
        """Tokens a step of `mode` computed that a later step read, and the seconds the
        later one waited for them."""
        if self._trial is not None and mode in self._trial:
            t = self._trial[mode]
            t[1], t[2] = t[1] + tokens, t[2] + seconds
        elif self._trial is None and mode in self._pool:
            self._add(mode, tokens, seconds)

    def _add(self, mode: str, tokens: int, seconds: float) -> None:
        pool = self._pool[mode]
        pool[0], pool[1] = pool[0] + tokens, pool[1] + seconds

    def observe(
        self,
        mode: str,
        tokens: int,
        seconds: float,
        rows: int | None = None,
        evidence: int = 0,
        entry: bool = False,
    ) -> None:
        """One step of `mode` emitted `tokens` in `seconds` with `rows` live rows and the
        drafters' `evidence`; then choose the next step's mode. `entry`: the step queued
        the first of a double-buffered kind's steps and read none of its own (class
        docstring): in a trial it measures nothing and does not count toward its block."""
        self.steps[mode] += 1
        trial = self._trial
        if entry and trial is not None and mode in trial:
            return
        if trial is None:
            self._add(mode, tokens, seconds)
            self._since += 1
            learned = self.mode != "draft" and evidence >= max(self.EVIDENCE, 2 * self._evidence)
            if self._moved(rows):
                self._start_trial(self.kinds, forget=self.kinds)
            elif self._since >= self._retry:
                self._start_trial(self.kinds)
            elif learned and "draft" in self.kinds:
                self._start_trial((self.mode, "draft"), forget=("draft",))
            return
        t = trial[mode]
        t[0], t[1], t[2] = t[0] + 1, t[1] + tokens, t[2] + seconds
        rates = {m: (tok / sec if sec > 0 else 0.0) for m, (_, tok, sec) in trial.items()}
        if all(trial[m][0] >= self._block[m] for m in trial):
            best = max(rates.values())
            self._out |= {m for m in trial if best >= self.CLEAR * rates[m]}
        left = [m for m in trial if m not in self._out]
        if len(left) == 1 or all(trial[m][0] >= self.TRIAL for m in left):  # the trial ended
            for m, (_, tok, sec) in trial.items():
                pool = self._pool[m]
                pool[0], pool[1] = self.DECAY * pool[0] + tok, self.DECAY * pool[1] + sec
            pooled = {m: (tok / sec if sec > 0 else 0.0) for m, (tok, sec) in self._pool.items()}
            self.rate = {**self.rate, **{m: pooled[m] for m in trial}}
            self.mode = max(left, key=lambda m: pooled[m])
            self.trials.append(({m: tuple(v) for m, v in trial.items()}, self.mode))
            self._lost = (self._lost - set(trial)) | self._out
            same = self.mode == self._won
            self._retry = min(2 * self._retry, self.RETRY_MAX) if same else self.RETRY
            self._won = self.mode
            self._trial, self._since, self._rows = None, 0, rows or self._rows
            self._evidence = evidence
        elif mode not in left or t[0] >= self.TRIAL or (t[0] - self._block[mode]) % self.BLOCK == 0:
            # the next kind in turn that is still to run its trial steps
            turn = self.kinds.index(mode)
            order = self.kinds[turn + 1 :] + self.kinds[: turn + 1]
            self.mode = next(m for m in order if m in left and trial[m][0] < self.TRIAL)
