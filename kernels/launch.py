"""The launch both GPU backends share: a (node, walk) kernel pair with `verify_ops`'s
arguments (kernels/verify_cuda.py, kernels/verify_metal.py)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .tree import MAX_SIBLINGS, VerifyResult, per_row


def launch(
    kernels, logits, tokens, parents, draft_probs, uniforms, greedy, threads
) -> VerifyResult:
    """Run a GPU backend's (node, walk) kernel pair with `verify_ops`'s arguments.

    The node kernel runs one block of `threads` per (row, node) and writes each node's
    accepted child and target choice; the walk kernel (one thread per row) follows the
    accepted children from the root. Both backends share this launch; only their kernel
    sources differ.
    """
    B, N, V = logits.shape
    parents = mx.array(per_row(np.asarray(parents), B))  # (B, N): the kernels read per row
    has_q = draft_probs is not None and not greedy
    if not greedy and uniforms is None:
        raise ValueError("sampling verification needs uniforms (see draw_uniforms)")
    placeholder = mx.zeros((1,), dtype=mx.float32)
    u = placeholder if greedy else uniforms.astype(mx.float32)
    q = draft_probs if has_q else placeholder
    node, walk = kernels
    child, choice = node(
        inputs=[logits, tokens.astype(mx.int32), parents.astype(mx.int32), u, q],
        template=[("GREEDY", bool(greedy)), ("HAS_Q", bool(has_q)), ("MAXS", MAX_SIBLINGS)],
        grid=(B * N * threads, 1, 1),
        threadgroup=(threads, 1, 1),
        output_shapes=[(B, N), (B, N)],
        output_dtypes=[mx.int32, mx.int32],
    )
    path, accepted, num, nxt = walk(
        inputs=[child, choice],
        grid=(B, 1, 1),
        threadgroup=(min(B, 128), 1, 1),
        output_shapes=[(B, N), (B, N), (B,), (B,)],
        output_dtypes=[mx.int32, mx.bool_, mx.int32, mx.int32],
    )
    return VerifyResult(choice, child, accepted, path, num, nxt)
