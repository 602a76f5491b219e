"""Self-drafting with the EAGLE-style feature head (adapters/head.py): no target layer runs
per draft token, only the trained block over the target's own last-layer states.

The head reads pairs (h_p, x_{p+1}): the target's state at a committed position p (before
the final norm) and the token the target chose after it. Pair i of a row is position
len(prompt) - 1 + i with output token i, as in training. The engine keeps, per row, the
states of the positions it committed since the head last read them (`Sequence.states`,
filled by prefill, verify and plain steps alike, whichever drafter drafted), so the head
never misses a position.

Drafting a row: its unread pairs run through the block in one forward over the head's own
one-layer cache (per-row lengths, like the target's), the last one's predicted state gives
draft token 1 through the target's norm and head; deeper tokens feed the predicted state
back with the token just drafted (EAGLE's chain). The draft's own cache entries are then
dropped (the row's length goes back to its read pairs): the next read replaces them with
pairs built from the target's true states. Sampled rows draw with `sampling.choose` and the
target's per-position uniforms, like every model drafter, so a node is accepted exactly
when it equals the target's own token: lossless whatever the head learned.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..adapters.block import Adapter, draft_logits
from ..adapters.head import weight_share
from ..cache import BatchKVCache
from ..sampling import choose
from ..scorer import Segment, forward
from .base import Draft

KEEP_COMPACT = 16  # read states kept as slices of the verify steps' outputs, at most


class FeatureHeadDrafter:
    kind = "early-exit"  # its prior (draft_length.PRIORS); statistics are kept by name
    lookup = False
    calibrated = False
    reads_states = True  # the engine keeps each row's committed states for it

    def __init__(self, target, capacity: int, adapter: Adapter):
        self.target = target
        self.adapter = adapter
        self.name = "head"
        self.cache = BatchKVCache(1, capacity)  # the head block's keys and values
        self.keep = False  # keep the states read on the row (`read_states`): it learns online
        vocab = None if adapter.vocab is None else int(adapter.vocab.size)
        self._share = weight_share(target.model, vocab)

    def admit(self, seq) -> None:
        self.cache.lengths[seq.slot] = 0

    def propose(self, seqs, ks: list[int]) -> Draft:
        model, cache, fh = self.target.model, self.cache, self.adapter.block
        k_max = max(ks, default=0)
        tokens = mx.zeros((len(seqs), max(k_max, 1)), mx.int32)  # (R, K)
        live = [i for i, k in enumerate(ks) if k > 0]
        if not live:
            return Draft(sizes=list(ks), tokens=tokens, source=self.name)
        # Depth 0: the rows' unread pairs (h_p, x_{p+1}); the last one's prediction drafts.
        hs, ids, sizes = [], [], []
        for i in live:
            s = seqs[i]
            read = int(cache.lengths[s.slot])
            h = s.states[0] if len(s.states) == 1 else mx.concatenate(s.states)  # (n, D)
            n = len(s.output) - read
            if h.shape[0] != n:
                raise RuntimeError(f"row {s.slot}: {h.shape[0]} unread states for {n} tokens")
            hs.append(h)
            if self.keep:
                s.read_states.append(h)
                if len(s.read_states) >= KEEP_COMPACT:  # one buffer: the steps' outputs go
                    s.read_states = [mx.concatenate(s.read_states)]
                    mx.async_eval(s.read_states[0])
            ids += s.output[read : read + n]
            sizes.append(n)
        x = fh.fuse(model, mx.concatenate(hs) if len(hs) > 1 else hs[0], mx.array(ids, mx.int32))
        slots = [seqs[i].slot for i in live]
        seg = Segment(slots, [[0] * n for n in sizes], hidden=x)
        pred = forward(model, cache, [seg], stop=1, blocks={0: fh.block})[0]  # (N, D)
        last = np.cumsum(sizes) - 1
        pred = pred[mx.array(last.astype(np.int32))]  # (R', D)
        base = cache.lengths[slots] + np.asarray(sizes)
        cache.lengths[slots] = base
        for depth in range(k_max):
            pos = np.array([len(seqs[i].history) + depth for i in live])
            seeds = np.array([seqs[i].seed for i in live], dtype=np.uint32)
            logits = draft_logits(model, self.adapter, pred)  # (R', V): -inf off its vocabulary
            drafted = choose(logits, [seqs[i].params for i in live], seeds, pos)
            tokens[mx.array(live), depth] = drafted
            nxt = [j for j, i in enumerate(live) if ks[i] > depth + 1]
            if not nxt:
                break
            if len(nxt) < len(live):
                sel = mx.array(nxt)
                pred, drafted, base = pred[sel], drafted[sel], base[nxt]
                live, slots = [live[j] for j in nxt], [slots[j] for j in nxt]
            cache.lengths[slots] = base + depth  # the chain's own entries, dropped below
            seg = Segment(slots, [[0]] * len(live), hidden=fh.fuse(model, pred, drafted))
            pred = forward(model, cache, [seg], stop=1, blocks={0: fh.block})[0]
        for i in [i for i, k in enumerate(ks) if k > 0]:
            s = seqs[i]
            cache.lengths[s.slot] = len(s.output)  # every pair read, the chain's dropped
            s.states = []
        return Draft(sizes=list(ks), tokens=tokens, source=self.name)

    def commit(self, seqs, draft: Draft, paths) -> None:
        pass  # the pairs the verify step committed arrive through `Sequence.states`

    def retire(self, seq) -> None:
        self.cache.lengths[seq.slot] = 0
        seq.states = []
        seq.read_states = []

    def step_cost(self, rows: int) -> float:
        return self._share

    def evidence(self) -> int:
        return 0
