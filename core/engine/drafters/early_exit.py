"""Self-drafting by early exit: the target's first L layers + its final norm + its LM head.

No weight copies and no cache of its own: the draft's KV entries for layers < L are the
target's cache entries, and verification resumes at layer L from the hidden states the
draft already computed (LayerSkip's exit-query reuse). Rollback is the engine's.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from ..sampling import choose
from ..scorer import Segment, forward, head
from .base import Draft


class EarlyExitDrafter:
    kind = "early-exit"
    lookup = False
    calibrated = False
    prior = None  # its kind's guessed prior

    def __init__(self, target, cache, exit_layer: int):
        n = target.num_layers
        if not 0 < exit_layer < n:
            raise ValueError(f"early-exit layer must be between 1 and {n - 1}, got {exit_layer}")
        self.target = target
        self.cache = cache  # the target's cache, shared
        self.exit_layer = exit_layer
        self.name = f"early-exit:{exit_layer}"
        # Cost of a draft token: the share of the weights it reads (layers < L + head).
        model = target.model
        total = sum(v.size for _, v in _leaves(model))
        part = sum(v.size for layer in model.model.layers[:exit_layer] for _, v in _leaves(layer))
        emb = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens
        self._share = (part + sum(v.size for _, v in _leaves(emb))) / total

    def admit(self, seq) -> None:
        pass

    def propose(self, seqs, ks: list[int]) -> Draft:
        """k_r draft tokens per row, one partial forward per depth; hidden states for
        [pending, d1..dk] at layer L come back packed in row order."""
        L, model, cache = self.exit_layer, self.target.model, self.cache
        rows = [s.slot for s in seqs]
        base = cache.lengths[rows].copy()
        k_max = max(ks, default=0)
        tokens = mx.zeros((len(seqs), max(k_max, 1)), mx.int32)  # (R, K)
        hidden, order = [], []  # per depth: (n, D) hidden states, and whose they are
        live = list(range(len(seqs)))  # rows still drafting at this depth
        ids = mx.array([s.pending for s in seqs], mx.int32)
        try:
            for depth in range(k_max + 1):
                # Node `depth` of each live row: slot base + depth, layers [0, L).
                cache.lengths[[rows[i] for i in live]] = base[live] + depth
                seg = Segment([rows[i] for i in live], [[0]] * len(live), ids=ids)
                h = forward(model, cache, [seg], stop=L)[0]  # (n, D)
                hidden.append(h)
                order.append(live)
                nxt = [j for j, i in enumerate(live) if ks[i] > depth]
                if not nxt:
                    break
                live_next = [live[j] for j in nxt]
                h_next = h[mx.array(nxt)] if len(nxt) < len(live) else h
                logits = self._logits(h_next, [rows[i] for i in live_next])
                pos = np.array([len(seqs[i].history) + depth for i in live_next])
                seeds = np.array([seqs[i].seed for i in live_next], dtype=np.uint32)
                ids = choose(logits, [seqs[i].params for i in live_next], seeds, pos)
                tokens[mx.array(live_next), depth] = ids
                live = live_next
        finally:
            cache.lengths[rows] = base
        # Packed [h_0 .. h_k] per row, rows in order: where each (row, depth) landed.
        where, n = {}, 0
        for depth, live_d in enumerate(order):
            for j, i in enumerate(live_d):
                where[(i, depth)] = n + j
            n += len(live_d)
        flat = mx.concatenate(hidden) if len(hidden) > 1 else hidden[0]
        index = [where[(i, d)] for i in range(len(seqs)) for d in range(ks[i] + 1)]
        return Draft(
            sizes=list(ks),
            tokens=tokens,
            hidden=flat[mx.array(index)],
            start_layer=L,
            source=self.name,
        )

    def _logits(self, h: mx.array, slots: list[int]) -> mx.array:
        """(n, D) hidden states at layer L of the next node of rows `slots` (their cache
        lengths set to that node's position) -> (n, V) draft logits."""
        return head(self.target.model, h)

    def commit(self, seqs, draft: Draft, paths) -> None:
        pass  # the engine sets the shared cache's lengths

    def retire(self, seq) -> None:
        pass

    def step_cost(self, rows: int) -> float:
        return self._share

    def evidence(self) -> int:
        return 0


def _leaves(module):
    from mlx.utils import tree_flatten

    return tree_flatten(module.parameters())
