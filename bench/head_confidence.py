"""What the stored feature head's probability of its own token is worth: every chain node it
drafts on a job is verified (a flat cost surface, the gate asked on every step), and each
node's outcome is counted in the bin of the head's probability (`confidence.ProbabilityBins`,
the calibration the gate uses). Prints, per bin, the nodes verified, how often they were
accepted (once their parent was) and the share of first nodes that fall in it; then what the
gate would keep at this machine's surface at the given batch sizes if chances were the rates
measured here.

    python bench/head_confidence.py --input open-held-out.jsonl --batch-size 64
"""

from __future__ import annotations

import argparse

import numpy as np

from core.benchmark import load_job
from core.engine import CostSurface, Engine, GenerationParams
from core.engine.costs import load_kept
from core.engine.draft_length import Offer, allocate
from core.engine.drafters.feature_head import FeatureHeadDrafter
from core.models import load_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--items", type=int, default=64)
    ap.add_argument("--draft", default="head")
    args = ap.parse_args()
    target = load_model("smollm2-135m")
    items = load_job(target, args.input, None)[: args.items]
    reqs = [(it.prompt, GenerationParams(max_tokens=it.max_tokens)) for it in items]
    firsts: list[float] = []
    heads: list[FeatureHeadDrafter] = []
    chances = FeatureHeadDrafter.chances

    def spy(self, seqs, draft):
        if self not in heads:
            heads.append(self)
        probs = np.array(draft.confidence)
        firsts.extend(probs[[r for r, n in enumerate(draft.sizes) if n], 0].tolist())
        return chances(self, seqs, draft)

    FeatureHeadDrafter.chances = spy
    engine = Engine(
        target,
        draft=args.draft,
        surface=CostSurface.flat(),
        batch_size=args.batch_size,
        step_modes=False,
        gate_cost=-1.0,  # ask on every step; the flat surface keeps every node
    )
    engine.generate_many(reqs)
    (head,) = heads
    cal = head.calibration
    tried = cal.tries - 2.0  # less the prior's weight
    rates = cal.rates()
    first_bins = np.bincount(cal.buckets(np.array(firsts)), minlength=cal.bins)
    print(f"{args.draft}: {len(items)} items at batch {args.batch_size}, {len(firsts)} first nodes")
    print("head probability   nodes verified   accepted   share of first nodes")
    for b in range(cal.bins):
        lo, hi = b / cal.bins, (b + 1) / cal.bins
        print(
            f"  {lo:.1f}-{hi:.1f}  {int(tried[b]):>14d}   {rates[b]:8.3f}   "
            f"{first_bins[b] / max(1, len(firsts)):8.3f}"
        )
    mean_first = float((rates * first_bins).sum() / max(1, first_bins.sum()))
    print(f"first-node acceptance over all bins: {mean_first:.3f}")
    surface = load_kept(target.model, target.weight_format)
    if surface is None:
        return
    print(
        "the gate at this machine's surface, one first node per row, chances as measured, "
        "the head's own cost counted (expected tokens per unit of time against plain steps):"
    )
    order = np.repeat(np.arange(cal.bins), first_bins)  # first nodes' bins, ascending
    cost = head.step_cost(1)
    for B in (1, 16, 64, 128):
        # B rows drawn evenly from the measured mix of bins: which of them pay?
        bins = order[((np.arange(B) + 0.5) / B * len(order)).astype(int)]
        offers = [Offer(np.array([rates[b]]), "head") for b in bins]
        ks = allocate(offers, surface, {"head": cost})
        gain = sum(o.gains[0] for o, k in zip(offers, ks, strict=True) if k)
        at = surface.at(B)
        plain, step = at(np.array([B, B + sum(ks)], float))
        rate = (B + gain) / (step / plain + (cost if sum(ks) else 0.0)) / B
        print(
            f"  {B:>4} rows: {sum(ks):>3} verify a node, {gain / B:.3f} tokens gained per row, {rate:.3f}x"
        )


if __name__ == "__main__":
    main()
