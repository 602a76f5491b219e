"""The host-synced speculative step: admit, plan prefill chunks and drafts, one target
forward over every row's nodes and the chunks, one sync, commit."""

from __future__ import annotations

import time

import mlx.core as mx

from .commit import choices
from .results import GenerationResult
from .scorer import Segment, forward


class SyncedSteps:
    """A batch's host-synced steps (drafting, or one token a row where rows need the host)."""

    def __init__(self, batch):
        self.batch = batch

    def run(self, drafters) -> list[GenerationResult]:
        """One step whose rows choose among `drafters`; the results of rows that finished."""
        b = self.batch
        cfg = b.config
        b.report.drafters = tuple(d.name for d in drafters)
        ta = time.perf_counter()
        b.plain.read_lag()
        b.admission.admit()
        prefill = b.prefill.plan()
        decode = [s for s in b.rows if s is not None and s.decoding]
        t0 = time.perf_counter()
        plan = b.proposal.plan(decode, drafters) if decode else None
        if cfg.profile and plan is not None:
            mx.eval([d.tokens for d in plan.drafts.values() if isinstance(d.tokens, mx.array)])
        t1 = time.perf_counter()
        segments, views = [], []
        if plan is not None:
            for seg, view in plan.segments():
                segments.append(seg)
                views.append(view)
        if prefill:
            segments.append(
                Segment([s.slot for s, _ in prefill], [c for _, c in prefill], logits="last")
            )
        if not segments:
            return b.commit.results()
        states = [] if b.reads_states else None
        outs = forward(b.target.model, b.cache, segments, states=states)
        if cfg.profile:
            mx.eval(outs)
        chosen = [choices(v, o) for v, o in zip(views, outs, strict=False)]
        picks = [c for c, _ in chosen]
        lps = [lp for _, lp in chosen]
        first, first_lp = None, None
        if prefill:
            first, first_lp = b.prefill.first_tokens(prefill, outs[-1])
        # A prefill chunk is computed in its own step, even where no row's prompt ends
        # here: deferred, the chunks' graphs would pile up until the last one.
        pending = [*picks, *([first] if first is not None else [outs[-1]] if prefill else [])]
        pending += [a for lp in [*lps, first_lp] if lp is not None for a in lp]
        pending += [h for h in states or [] if h is not None]
        pending += [
            d.tokens
            for d in (plan.drafts.values() if plan else [])
            if isinstance(d.tokens, mx.array)
        ]
        mx.async_eval(pending)
        r0 = time.perf_counter()
        results = b.commit.results() if cfg.overlap else []  # host work while the device runs
        r1 = time.perf_counter()
        mx.eval(pending)  # the step's one sync
        t3 = time.perf_counter()
        cache_s = 0.0
        if plan is not None:
            host_lps = [None if lp is None else [a.tolist() for a in lp] for lp in lps]
            cache_s = b.commit.verified(plan, [p.tolist() for p in picks], views, host_lps, states)
        if prefill:
            b.prefill.commit(
                prefill,
                first.tolist() if first is not None else None,
                None if first_lp is None else [a.tolist() for a in first_lp],
                states[-1] if states else None,
            )
        t4 = time.perf_counter()
        b.report.phases.update(
            plan=t0 - ta,
            draft=t1 - t0,
            forward=r0 - t1,
            overlap=r1 - r0,
            sync=t3 - r1,
            commit=t4 - t3,
        )
        if plan is not None:
            # Each row's share of the step. Unprofiled, the device's forward time is in
            # verify_s (the wait at the sync), beside building the forward.
            share = 1.0 / len(decode)
            for s in decode:
                ph = s.metrics.phases
                ph["draft_s"] += (t1 - t0) * share
                ph["verify_s"] += (t3 - t1 - (r1 - r0)) * share
                ph["accept_s"] += (t4 - t3 - cache_s) * share
                ph["cache_s"] += cache_s * share
        b.steps += 1
        return results if cfg.overlap else b.commit.results()
