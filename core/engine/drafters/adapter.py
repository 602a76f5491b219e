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

from ..adapters.block import Adapter, weight_share
from ..scorer import Segment, forward, head
from .early_exit import EarlyExitDrafter


class AdapterDrafter(EarlyExitDrafter):
    kind = "early-exit"  # its prior (draft_length.PRIORS); statistics are kept by name
    lookup = False
    calibrated = False

    def __init__(self, target, cache, adapter: Adapter):
        super().__init__(target, cache, adapter.layer)
        self.adapter = adapter
        self.name = f"adapter:{adapter.layer}"
        self._share = weight_share(target.model, adapter)

    def _logits(self, h: mx.array, slots: list[int]) -> mx.array:
        L, model = self.exit_layer, self.target.model
        seg = Segment(slots, [[0]] * len(slots), hidden=h, start_layer=L)
        out = forward(model, self.cache, [seg], stop=L + 1, blocks={L: self.adapter.block})[0]
        # With L + 1 the last layer, forward already applied the norm and head.
        return out if L + 1 == self.target.num_layers else head(model, out)
