"""The early-exit adapter: the target's first L layers + one trained block + its final norm
and head, drafting through the target's own KV cache.

The trained block is a copy of the target's layer L (the finding's best initialisation)
whose query projection, output projection, MLP and post-attention norm are trained, while
its input norm and key/value projections stay the target's own, frozen. Its keys and values
at any position are then exactly the target's layer-L cache entries there (both project the
same layer-L hidden state with the same weights), so the block attends over the shared
cache at layer L and needs no cache of its own:

- every committed token has layer-L entries, however it was committed (prefill, plain
  steps, bonus tokens, another drafter's verified nodes): the holes a block with its own
  K/V would see when the engine commits tokens without running the drafter cannot happen;
- while drafting, the block writes layer-L entries for the draft nodes (the same values
  the target will write); verification, which resumes at layer L, overwrites them before
  reading, so output stays lossless whatever the block learned.

Training runs the same block over whole sequences with mlx-lm's causal mask
(`draft_hidden`), which computes exactly what the drafter computes node by node.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..scorer import head

KIND = "early-exit"
# Frozen: the target's own, so the block's keys/values equal the target's layer-L entries.
FROZEN = ("input_layernorm", "self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm")


@dataclass
class Adapter:
    """A trained self-drafter for one target.

    Attributes:
        kind: "early-exit" (the only kind so far).
        layer: L, where the block sits: the target's layers [0, L) run before it.
        block: the trained block (an mlx-lm decoder layer of the target's family).
        meta: what the store keeps beside the weights (model key, agreement, tokens, curve).
        vocab: (Vr,) int32 token ids the draft head scores (the tokens the target emits
            most), or None for the whole vocabulary; the others are never drafted.
    """

    kind: str
    layer: int
    block: nn.Module
    meta: dict = field(default_factory=dict)
    vocab: mx.array | None = None  # (Vr,)
    _rows: mx.array | None = field(default=None, repr=False)  # (Vr, D) head rows of `vocab`

    @property
    def agreement(self) -> float:
        return float(self.meta.get("agreement", 0.0))

    def trainable(self) -> dict[str, mx.array]:
        """The trained weights by name (what the store writes)."""
        return dict(tree_flatten(self.block.trainable_parameters()))

    def size(self) -> int:
        """Trained parameters."""
        return sum(v.size for v in self.trainable().values())


def new_adapter(model: nn.Module, layer: int) -> Adapter:
    """An untrained early-exit adapter at `layer`: a copy of the target's layer `layer`
    (its output equals early exit at layer + 1 until it is trained). A quantized layer (GPU
    backends keep GGUF weights quantized) is copied dequantized: the block trains in float
    while the target stays as it is.

    Raises:
        ValueError: the layer is not in [1, num_layers - 1].
    """
    from mlx_lm.utils import dequantize_model

    layers = model.model.layers
    n = len(layers)
    if not 0 < layer < n:
        raise ValueError(f"exit layer must be between 1 and {n - 1}, got {layer}")
    src = layers[layer]
    block = type(src)(model.args)
    if any(hasattr(m, "scales") for _, m in src.named_modules()):
        block = dequantize_model(copy.deepcopy(src))
    else:  # arrays are immutable: sharing them is a copy until training replaces one
        block.update(src.parameters())
    _freeze(block)
    return Adapter(KIND, layer, block)


def clone(adapter: Adapter) -> Adapter:
    """A copy of `adapter` whose block can be trained without touching the original's."""
    block = copy.deepcopy(adapter.block)
    _freeze(block)
    return Adapter(adapter.kind, adapter.layer, block, dict(adapter.meta), adapter.vocab)


def _freeze(block: nn.Module) -> None:
    block.unfreeze()
    for path in FROZEN:
        mod = block
        for part in path.split("."):
            mod = getattr(mod, part, None)
            if mod is None:
                break
        if mod is not None:
            mod.freeze()


def exit_hidden(model: nn.Module, ids: mx.array, layer: int) -> mx.array:
    """The target's first `layer` layers over whole sequences: (B, T) ids -> (B, T, D), the
    input of layer `layer` (causal; right padding leaves earlier positions unchanged)."""
    h = model.model.embed_tokens(ids)
    mask = "causal" if ids.shape[1] > 1 else None
    for blk in model.model.layers[:layer]:
        h = blk(h, mask)
    return h


def prefix_hidden(model: nn.Module, ids: mx.array, layer: int) -> tuple[mx.array, mx.array]:
    """The target over whole sequences: (B, T) ids -> hidden states at `layer` and after the
    last layer, both (B, T, D)."""
    h_exit = h = exit_hidden(model, ids, layer)
    mask = "causal" if ids.shape[1] > 1 else None
    for blk in model.model.layers[layer:]:
        h = blk(h, mask)
    return h_exit, h


def draft_hidden(adapter: Adapter, h_exit: mx.array) -> mx.array:
    """The trained block over whole sequences: (B, T, D) at layer L -> (B, T, D) for the
    head (what the drafter computes one node at a time)."""
    mask = "causal" if h_exit.shape[1] > 1 else None
    return adapter.block(h_exit, mask)


def vocab_rows(model: nn.Module, vocab: mx.array) -> mx.array:
    """(Vr, D) the target's output-head rows of the (Vr,) tokens `vocab`."""
    if hasattr(model, "lm_head"):
        if not isinstance(model.lm_head, nn.Linear) or hasattr(model.lm_head, "scales"):
            raise ValueError("a reduced draft vocabulary needs an unquantized output head")
        return model.lm_head.weight[vocab]
    return model.model.embed_tokens(vocab)  # tied: the embedding rows (dequantized by the lookup)


def reduced_logits(model: nn.Module, adapter: Adapter, h: mx.array) -> mx.array:
    """(..., D) hidden states -> (..., Vr) logits of the adapter's vocabulary only (the
    target's norm, then its head rows for those tokens)."""
    if adapter._rows is None or adapter._rows.shape[0] != adapter.vocab.size:
        adapter._rows = vocab_rows(model, adapter.vocab)
    return model.model.norm(h) @ adapter._rows.T


def draft_logits(model: nn.Module, adapter: Adapter, h: mx.array) -> mx.array:
    """(..., D) block outputs -> (..., V) draft logits: the target's norm and head, over the
    adapter's reduced vocabulary when it has one (-inf elsewhere)."""
    if adapter.vocab is None:
        return head(model, h)
    small = reduced_logits(model, adapter, h)  # (..., Vr)
    V = model.model.embed_tokens.weight.shape[0]
    full = mx.full((*small.shape[:-1], V), -mx.inf, dtype=small.dtype)
    full[..., adapter.vocab] = small
    return full


def weight_share(model: nn.Module, layer: int, vocab_size: int | None = None) -> float:
    """The share of the target's weights one draft token of an adapter at `layer` reads
    (layers [0, L), the block, the head or its `vocab_size` reduced rows), counting the block
    as the size of a target layer."""
    total = param_count(model)
    part = sum(param_count(b) for b in model.model.layers[: layer + 1])
    emb = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens
    rows = param_count(emb)
    if vocab_size is not None:
        rows = rows * vocab_size / model.model.embed_tokens.weight.shape[0]
    return (part + rows) / total


def param_count(module: nn.Module) -> int:
    """Parameters as the model has them, however they are stored: a quantized layer's packed
    weight counts its unpacked elements (32 / bits per uint32), its scales and biases none."""
    packed = {
        name: m.bits
        for name, m in module.named_modules()
        if isinstance(m, nn.QuantizedLinear | nn.QuantizedEmbedding)
    }
    n = 0
    for key, v in tree_flatten(module.parameters()):
        owner, _, leaf = key.rpartition(".")
        if owner not in packed or leaf == "bias":
            n += v.size
        elif leaf == "weight":
            n += v.size * 32 // packed[owner]
    return n


def target_size(model: nn.Module) -> int:
    """The target's parameters (embeddings counted once when tied; quantized ones unpacked)."""
    return param_count(model)
