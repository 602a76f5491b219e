"""Self-drafting with a trained early-exit adapter (adapters/block.py): the target's first L
layers, then the trained block over the shared cache's layer-L entries, then the target's
final norm and head.

Drafting is early exit's (same shared cache, same per-depth partial forwards, verification
resumes at layer L from the draft's own layer-L hidden states); only the logits a node is
drawn from differ. Sampled rows draw with `sampling.choose` and the target's per-position
uniforms, like every model drafter: a node is accepted exactly when it equals the target's
own token, so output is lossless whatever the adapter learned.
"""

from __future__ import annotations

import mlx.core as mx

from ..adapters.block import Adapter, draft_logits, weight_share
from ..draft_length import PRIORS
from ..scorer import Segment, forward
from .early_exit import EarlyExitDrafter


class AdapterDrafter(EarlyExitDrafter):
    kind = "early-exit"  # its prior (draft_length.PRIORS); statistics are kept by name
    lookup = False
    calibrated = False

    def __init__(self, target, cache, adapter: Adapter):
        super().__init__(target, cache, adapter.layer)
        self.adapter = adapter
        self.name = f"adapter:{adapter.layer}"
        vocab = None if adapter.vocab is None else int(adapter.vocab.size)
        self._share = weight_share(target.model, adapter.layer, vocab)
        # The first draft token's held-out agreement; deeper ones keep the kind's guess.
        self.prior = (adapter.agreement, *PRIORS[self.kind][1:]) if adapter.agreement > 0 else None

    def _logits(self, h: mx.array, slots: list[int]) -> mx.array:
        L, model, adapter = self.exit_layer, self.target.model, self.adapter
        seg = Segment(slots, [[0]] * len(slots), hidden=h, start_layer=L)
        out = forward(model, self.cache, [seg], stop=L + 1, blocks={L: adapter.block})[0]
        if L + 1 < self.target.num_layers:
            return draft_logits(model, adapter, out)  # (n, V)
        # L + 1 is the last layer: forward applied the norm and the whole head already.
        if adapter.vocab is None:
            return out
        keep = mx.zeros((out.shape[-1],), mx.bool_)
        keep[adapter.vocab] = True
        return mx.where(keep, out, -mx.inf)
