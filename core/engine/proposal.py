"""Proposal: which drafter drafts for each decoding row this step and how many tokens, from
the rows' measured acceptance and this machine's verify costs (draft_length.py), and the
drafts themselves."""

from __future__ import annotations

import numpy as np

from .draft_length import K_INIT, K_MAX, Offer, RowPolicy, allocate, token_cost
from .draft_length import gate as gate_nodes
from .drafters.base import Draft, Drafter
from .packing import StepPlan
from .sequence import Sequence


class Proposal:
    """A batch's drafting decisions, step by step."""

    def __init__(self, batch):
        self.batch = batch

    def plan(self, decode: list[Sequence], drafters: list[Drafter]) -> StepPlan:
        """Each decoding row's drafter and draft length this step (`drafters`: those its
        rows choose among), and the drafts: lookups offer what they have, each row takes
        the offer with the best rate alone, `allocate` spends the batch's draft tokens
        against the verify surface, model drafters then draft exactly that many, and
        drafters that know their chances keep the nodes that pay (`gate`)."""
        b = self.batch
        eng = b.engine
        k = b.config.k
        B = len(decode)
        ctx = b.target.context_length
        caps = [max(0, min(K_MAX, s.room - 1, ctx - s.cached - 2)) for s in decode]
        lookups: dict[str, Draft] = {}
        for d in drafters:
            if d.lookup:
                lookups[d.name] = d.propose(decode, caps)
        choice: list[Drafter | None] = [None] * B
        ks = [0] * B
        offers: list[Offer] | None = None
        if drafters and k is not None:  # fixed k: the first drafter with something
            for i in range(B):
                for d in drafters:
                    avail = lookups[d.name].sizes[i] if d.lookup else caps[i]
                    if avail:
                        choice[i], ks[i] = d, min(k, avail)
                        break
        elif drafters:
            offers = []
            marginal = max(eng.surface.relative(B, B + 1) - 1.0, 1e-6)
            costs = {d.name: d.step_cost(B) for d in drafters if not d.lookup and k is None}
            for i, s in enumerate(decode):
                best, best_rate = None, 1.0
                for d in drafters:
                    offer = self.offer(d, s, i, lookups, caps[i])
                    if offer is None:
                        continue
                    rate = alone_rate(offer, marginal, costs.get(d.name, 0.0) / B)
                    warm = offer.forced and not offer.probe
                    if warm or rate > best_rate:
                        best, best_rate = (d, offer), (np.inf if warm else rate)
                if best is None:  # nothing pays: re-probe a due drafter with one token
                    for d in (d for d in drafters if not d.calibrated):
                        pol = s.stats[d.name]
                        avail = lookups[d.name].sizes[i] if d.lookup else caps[i]
                        if pol.probe_due() and avail:
                            best = (d, Offer(pol.stats.gains(1), _group(d), forced=1))
                            break
                choice[i] = best[0] if best else None
                offers.append(best[1] if best else Offer(np.zeros(0)))
            ks = allocate(offers, eng.surface, costs)
        drafts: dict[str, Draft] = {}
        members: dict[str, list[int]] = {}
        for i, d in enumerate(choice):
            if d is not None and ks[i] > 0:
                members.setdefault(d.name, []).append(i)
            else:
                choice[i] = None
        for d in drafters:
            idx = members.get(d.name)
            if not idx:
                continue
            if d.lookup:
                full = lookups[d.name]
                sub = Draft(
                    sizes=[full.sizes[i] for i in idx],
                    tokens=[full.tokens[i] for i in idx],
                    parents=None if full.parents is None else [full.parents[i] for i in idx],
                    chances=None if full.chances is None else [full.chances[i] for i in idx],
                    source=full.source,
                )
                drafts[d.name] = sub.truncate([ks[i] for i in idx])
            else:
                drafts[d.name] = d.propose([decode[i] for i in idx], [ks[i] for i in idx])
        if offers is not None:
            self.gate(decode, ks, offers, drafts, members)
        static = b.capacity if b.cache.pad > 1 else None
        return StepPlan(decode, choice, drafts, members, b.drafters, static)

    def gate(self, decode, ks, offers, drafts: dict[str, Draft], members) -> None:
        """Where verifying a token costs real time at this batch, rows drafted by a drafter
        that can say how sure it is keep only the nodes that pay (draft_length.gate)."""
        sure = [n for n, dr in drafts.items() if dr.confidence is not None]
        B = len(decode)
        if (
            not sure
            or token_cost(self.batch.engine.surface, B, B + sum(ks)) < self.batch.config.gate_cost
        ):
            return
        chances: dict[int, list[float]] = {}
        for name in sure:
            d = next(x for x in self.batch.drafters if x.name == name)
            rows = members[name]
            rows_chances = d.chances([decode[i] for i in rows], drafts[name])
            chances.update(zip(rows, rows_chances, strict=True))
        kept = gate_nodes(offers, ks, chances, self.batch.engine.surface)
        for name in sure:
            drafts[name] = drafts[name].truncate([kept[i] for i in members[name]])

    def offer(self, d: Drafter, s: Sequence, i: int, lookups, cap: int) -> Offer | None:
        pol: RowPolicy = s.stats[d.name]
        if d.lookup:
            look = lookups[d.name]
            n = look.sizes[i]
            if n == 0:
                return None
            gains = (
                np.minimum.accumulate(np.asarray(look.chances[i][:n]))
                if look.chances
                else pol.stats.gains(n)
            )
        else:
            # A penalised row's adjustment depends on the drafted tokens: only host drafts.
            if cap == 0 or s.params.frequency_penalty or s.params.presence_penalty:
                return None
            gains = pol.stats.gains(cap)
        # A calibrated drafter's chances are learned across rows: no per-row warm-up.
        forced = min(K_INIT, len(gains)) if pol.warming() and not d.calibrated else 0
        if not forced and hasattr(d, "chances") and pol.probe_due():
            # The gate dropped its nodes a while: a probe teaches the drafter's chances. It
            # holds only where the row would choose this drafter (`_draft`): against a better
            # drafter's offer it would give that row's step away (a row drafting a job's
            # answer template from the suffix index, probed every `PROBE_EVERY` steps by a
            # head that never drafts for it).
            return Offer(gains, _group(d), 1, probe=True)
        return Offer(gains, _group(d), forced)


def _group(d: Drafter) -> str | None:
    return None if d.lookup else d.name


def alone_rate(offer: Offer, marginal: float, step_cost: float) -> float:
    """The best rate one row gets from an offer alone (tokens per plain-step cost)."""
    if not len(offer.gains):
        return 1.0
    m = np.arange(1, len(offer.gains) + 1)
    rates = (1.0 + np.cumsum(offer.gains)) / (1.0 + m * (marginal + step_cost))
    return float(rates.max())
