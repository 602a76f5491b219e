"""The feature head: an EAGLE-style self-drafter over the target's own last hidden states.

After a verify step the target has computed, at a row's last accepted position p, its last
layer's hidden state h_p (whose head gives the next token x_{p+1}). The head drafts the
token after that without running any target layer: it fuses the target's normalized h_p
with the embedding of x_{p+1} (one linear map from 2D to D), runs one decoder block of the
target's family over the fused sequence (causal: a position attends over the earlier ones
of the same answer) and predicts h_{p+1}; the target's frozen final norm and head turn that
into the distribution of x_{p+2}. Drafting deeper feeds the predicted state back in
(EAGLE's chain). The target stays frozen, so verification and output are untouched.

Trained and measured by core/training/head.py, like the early-exit adapter.

Stored like an early-exit adapter (`store.py`: an `Adapter` of kind "feature-head" whose
layer is the target's layer count, after all of them) and drafted by
`drafters/feature_head.py`. Like an adapter it may score a reduced draft vocabulary (the
tokens the target emits most): the output head is most of what a head draft token reads
(the block is one layer), so Vr of V rows make a draft token, and training, that much
cheaper.
"""

from __future__ import annotations

import copy

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .block import Adapter, param_count, target_size

KIND = "feature-head"


class FeatureHead(nn.Module):
    """fc([norm(h_p); embed(x_{p+1})]) -> one decoder block -> predicted h_{p+1}.

    The block starts as a copy of the target's last layer and the fusion as the identity on
    the state (the embedding's half at zero), so the untrained head drafts what one more
    pass of the last layer over h_p gives.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        from mlx_lm.utils import dequantize_model

        src = model.model.layers[-1]
        D = model.args.hidden_size
        dtype = model.model.norm.weight.dtype
        self.fc = nn.Linear(2 * D, D, bias=False)
        self.fc.weight = mx.concatenate([mx.eye(D), mx.zeros((D, D))], axis=1).astype(dtype)
        if any(hasattr(m, "scales") for _, m in src.named_modules()):
            self.block = dequantize_model(copy.deepcopy(src))  # trained in float
        else:
            self.block = type(src)(model.args)
            self.block.update(src.parameters())

    def fuse(self, model: nn.Module, h: mx.array, tokens: mx.array) -> mx.array:
        """(..., D) target states at p and (...) tokens x_{p+1} -> (..., D) the block's input."""
        e = model.model.embed_tokens(tokens)
        return self.fc(mx.concatenate([model.model.norm(h), e], axis=-1))

    def __call__(self, model: nn.Module, h: mx.array, tokens: mx.array, mask=None) -> mx.array:
        """(B, T, D) target states at p and (B, T) tokens x_{p+1} -> (B, T, D) predicted
        states at p + 1."""
        return self.block(self.fuse(model, h, tokens), mask)


def new_head(model: nn.Module) -> FeatureHead:
    head_ = FeatureHead(model)
    mx.eval(head_.parameters())
    return head_


def size(head_: FeatureHead) -> int:
    """Trained parameters."""
    return sum(v.size for _, v in tree_flatten(head_.trainable_parameters()))


def new_head_adapter(model: nn.Module) -> Adapter:
    """An untrained feature head as the store keeps it: kind "feature-head", its layer the
    target's layer count (it reads the states after the last layer)."""
    return Adapter(KIND, len(model.model.layers), new_head(model))


def weight_share(model: nn.Module, vocab_size: int | None = None) -> float:
    """The share of the target's weights one draft token reads: the head's fusion and block
    and the target's output head (or its `vocab_size` reduced rows)."""
    emb = model.lm_head if hasattr(model, "lm_head") else model.model.embed_tokens
    head_ = param_count(emb)
    if vocab_size is not None:
        head_ = head_ * vocab_size / model.model.embed_tokens.weight.shape[0]
    D = model.args.hidden_size
    block = param_count(model.model.layers[-1])
    return (2 * D * D + block + head_) / target_size(model)
