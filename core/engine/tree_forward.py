"""One verify forward over every node of a token tree, through the model's own modules.

mlx-lm's attention applies RoPE at one scalar offset (consecutive positions), so the tree
path has its own attention call: the same q/k/v/o projections, norms and MLP, RoPE at
per-node positions (prefix length + depth) and a mask letting each node see the prefix,
its ancestors and itself. Per-node positions use the model's own `rope` module with the
nodes moved to the batch axis, where `mx.fast.rope` takes one offset per row, so
`traditional`, scaling and custom frequencies are exactly mlx-lm's.

After acceptance, `compact` keeps prefix + accepted path in the cache, in order.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.base import scaled_dot_product_attention

from .forward import embed, lm_head, read_width
from .tree import TokenTree

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")


def check_supported(model: nn.Module) -> None:
    """Raise ValueError unless the tree forward reproduces this architecture's layers."""
    kind = getattr(getattr(model, "args", None), "model_type", None)
    if kind not in SUPPORTED:
        raise ValueError(f"tree verification supports {', '.join(SUPPORTED)} models, not {kind!r}")


def rope_at(rope: nn.Module, x: mx.array, positions: mx.array) -> mx.array:
    """Apply the model's RoPE to (B, L, H, D) at per-token positions (L,) -> (B, H, L, D)."""
    B, L, H, D = x.shape
    rows = x.reshape(B * L, H, 1, D)  # each token its own row, offset = its position
    out = rope(rows, offset=mx.tile(positions, B))
    return out.reshape(B, L, H, D).transpose(0, 2, 1, 3)


def tree_attention(
    attn: nn.Module, x: mx.array, mask: mx.array, cache: Any, positions: mx.array
) -> mx.array:
    """mlx-lm llama/qwen2 attention with per-node positions and an explicit mask."""
    B, L, _ = x.shape
    q = attn.q_proj(x).reshape(B, L, attn.n_heads, -1)
    k = attn.k_proj(x).reshape(B, L, attn.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(B, L, attn.n_kv_heads, -1).transpose(0, 2, 1, 3)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = rope_at(attn.rope, q, positions)  # (B, H, L, D)
    k = rope_at(attn.rope, k, positions)
    k, v = cache.update_and_fetch(k, v)
    out = scaled_dot_product_attention(q, k, v, cache=cache, scale=attn.scale, mask=mask)
    return attn.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


def tree_block(layer: nn.Module, h: mx.array, mask, cache, positions) -> mx.array:
    """One pre-norm transformer block (mlx-lm's TransformerBlock) with tree attention."""
    h = h + tree_attention(layer.self_attn, layer.input_layernorm(h), mask, cache, positions)
    return h + layer.mlp(layer.post_attention_layernorm(h))


def tree_forward(
    model: nn.Module,
    tree: TokenTree,
    cache: list[Any],
    hidden: mx.array | None = None,
    start_layer: int = 0,
) -> mx.array:
    """Logits after every node of `tree`, its K/V appended to the cache in node order.

    Args:
        model: an mlx-lm llama / qwen2 model (its own weights and modules).
        tree: root (the last committed token, not yet cached) + draft nodes.
        cache: the target's per-layer caches holding the prefix.
        hidden: (1, N, D) hidden states at layer `start_layer` for the nodes, when the first
            layers already ran; None = start from the embeddings.
        start_layer: the first layer to run.

    Returns:
        (1, N, V) logits; row i is the target's prediction after node i.
    """
    check_supported(model)
    layers = model.model.layers[start_layer:]
    caches = cache[start_layer:]
    prefix = caches[0].offset
    mask = tree.attention_mask(prefix)  # (N, prefix + N)
    width = read_width(caches[0], prefix + tree.size)
    if width > mask.shape[1]:  # a padded cache (forward.kv_pad): padding is never attended
        mask = mx.concatenate([mask, mx.zeros((tree.size, width - mask.shape[1]), mx.bool_)], 1)
    positions = tree.positions(prefix)  # (N,)
    if hidden is None:
        hidden = embed(model, mx.array([tree.tokens], dtype=mx.int32))
    h = hidden
    for layer, c in zip(layers, caches, strict=True):
        h = tree_block(layer, h, mask, c, positions)
    return lm_head(model, h)


def compact(cache: list[Any], prefix_len: int, path: list[int]) -> None:
    """Keep prefix + the accepted path in the cache, in order; drop every other node.

    `path` holds node indices from the root (path[0] == 0). The K/V of node i sit at slot
    prefix_len + i; the kept ones move to consecutive slots, then the offset is lowered.
    """
    keep = len(path)
    moved = path != list(range(keep))
    src = mx.array([prefix_len + i for i in path], dtype=mx.int32)
    for c in cache:
        if moved:
            dst = slice(prefix_len, prefix_len + keep)
            c.keys[..., dst, :] = mx.take(c.keys, src, axis=2)
            c.values[..., dst, :] = mx.take(c.values, src, axis=2)
        c.trim(c.offset - (prefix_len + keep))
