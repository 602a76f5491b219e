"""A separate small model sharing the target's tokenizer drafts k tokens autoregressively.

Its cache has one row per batch slot, like the target's. A row's draft cache lags behind
its history by what the target accepted since the row last drafted; the first draft
forward feeds that catch-up, then one token per depth. Sampled rows draw their drafts with
the same per-position uniforms the target uses (sampling.choose), so the two agree more
often than with independent randomness.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..cache import BatchKVCache
from ..sampling import choose
from ..scorer import Segment, check_supported, forward
from .base import Draft

CATCH_UP_SPLIT = 16  # longer catch-ups (a fresh row's prompt) get a segment of their own


class DraftModelDrafter:
    kind = "model"
    lookup = False
    calibrated = False
    prior = None  # its kind's guessed prior

    def __init__(self, draft, capacity: int, step_cost):
        check_supported(draft.model)
        self.draft = draft
        self.name = f"draft-model:{draft.name}"
        self.cache = BatchKVCache(draft.num_layers, capacity)
        self._step_cost = step_cost  # rows -> one draft step / one plain target step

    def admit(self, seq) -> None:
        self.cache.lengths[seq.slot] = 0
        seq.state[self.name] = 0  # tokens of the row's history in the draft cache

    def propose(self, seqs, ks: list[int]) -> Draft:
        model, cache = self.draft.model, self.cache
        k_max = max(ks, default=0)
        tokens = mx.zeros((len(seqs), max(k_max, 1)), mx.int32)  # (R, K)
        live = [i for i, k in enumerate(ks) if k > 0]
        # Depth 0: catch up on the history since the row last drafted, pending token last.
        fresh = [seqs[i].history[seqs[i].state[self.name] :] for i in live]
        short = [j for j, f in enumerate(fresh) if len(f) <= CATCH_UP_SPLIT]
        long = [j for j, f in enumerate(fresh) if len(f) > CATCH_UP_SPLIT]
        segs = [
            Segment([seqs[live[j]].slot for j in part], [fresh[j] for j in part], logits="last")
            for part in (short, long)
            if part
        ]
        outs = forward(model, cache, segs)
        order = [j for part in (short, long) if part for j in part]
        logits = outs[0] if len(outs) == 1 else mx.concatenate(outs)
        if order != list(range(len(live))):
            logits = logits[mx.array(np.argsort(order))]
        for i, f in zip(live, fresh, strict=True):
            cache.lengths[seqs[i].slot] += len(f)
        for depth in range(k_max):
            pos = np.array([len(seqs[i].history) + depth for i in live])
            seeds = np.array([seqs[i].seed for i in live], dtype=np.uint32)
            ids = choose(logits, [seqs[i].params for i in live], seeds, pos)
            tokens[mx.array(live), depth] = ids
            nxt = [j for j, i in enumerate(live) if ks[i] > depth + 1]
            if not nxt:
                break
            live = [live[j] for j in nxt]
            ids = ids[mx.array(nxt)] if len(nxt) < len(ids) else ids
            seg = Segment([seqs[i].slot for i in live], [[0]] * len(live), ids=ids, logits="last")
            logits = forward(model, cache, [seg])[0]
            for i in live:
                cache.lengths[seqs[i].slot] += 1
        for i, s in enumerate(seqs):
            if ks[i]:  # the cache holds history + d1..d(k-1)
                s.state[self.name] = len(s.history) + ks[i] - 1
        return Draft(sizes=list(ks), tokens=tokens, source=self.name)

    def commit(self, seqs, draft: Draft, paths) -> None:
        for s, k, path in zip(seqs, draft.sizes, paths, strict=True):
            if k:
                drop = (k - 1) - min(len(path), k - 1)  # keep history + d1..dn
                self.cache.lengths[s.slot] -= drop
                s.state[self.name] -= drop

    def retire(self, seq) -> None:
        self.cache.lengths[seq.slot] = 0
        seq.state.pop(self.name, None)

    def step_cost(self, rows: int) -> float:
        return self._step_cost(rows)

    def evidence(self) -> int:
        return 0
