"""The token tree every verify implementation takes, and what verification keeps of it.

A tree is flat: `parents` (N,) or one per row (B, N), node 0 the root (parent -1), every
other node's parent before it, padding nodes (parent `PAD`) after a row's real ones.
`check_parents` enforces that; `children_table` and `tree_depths` derive what the walk reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import numpy as np

MAX_SIBLINGS = 64
PAD = -2  # the parent of a padding node (rows of a batch with fewer nodes)


@dataclass
class VerifyResult:
    """What the target kept of a token tree.

    Attributes:
        choice: (B, N) int32 token the target puts after node c if the walk reaches c
            (its accepted child's token, else argmax / the residual sample).
        child: (B, N) int32 accepted child of node c, -1 when none (or c is a leaf).
        accepted: (B, N) bool node on the accepted path (the root always is).
        path: (B, N) int32 accepted node indices from the root (path[:, 0] == 0), -1 padded.
        num_accepted: (B,) int32 accepted draft nodes (the root not counted).
        next_token: (B,) int32 the token after the deepest accepted node (correction or bonus).
    """

    choice: mx.array  # (B, N)
    child: mx.array  # (B, N)
    accepted: mx.array  # (B, N)
    path: mx.array  # (B, N)
    num_accepted: mx.array  # (B,)
    next_token: mx.array  # (B,)


def check_parents(parents) -> np.ndarray:
    """`parents` as an int32 numpy array, (N,) or (B, N), after checking each row is a tree
    in topological order followed by padding.

    Raises:
        ValueError: when a row's parents[0] != -1, some parents[j] is not in [0, j), or a
            real node follows padding.
    """
    p = np.asarray(parents, dtype=np.int64)
    rows = p.reshape(-1, p.shape[-1]) if p.ndim else p.reshape(1, -1)
    if rows.shape[1] == 0 or (rows[:, 0] != -1).any():
        raise ValueError("parents[0] must be -1 (node 0 is the root)")
    j = np.arange(rows.shape[1])
    pad = rows == PAD
    after_pad = np.cumsum(pad, axis=1) > 0
    bad = ~pad & ((rows < 0) | (rows >= j)) & (j > 0) | (after_pad & ~pad)
    if bad.any():
        b, k = np.argwhere(bad)[0]
        where = f"parents[{b}, {k}]" if p.ndim > 1 else f"parents[{k}]"
        raise ValueError(f"{where} = {int(rows[b, k])}: every node's parent must come before it")
    return p.astype(np.int32)


def per_row(parents, batch: int) -> np.ndarray:
    """(B, N) parents: a shared (N,) tree repeated for every row."""
    p = check_parents(parents)
    return np.broadcast_to(p, (batch, p.shape[-1])) if p.ndim == 1 else p


def children_table(parents) -> np.ndarray:
    """(..., N, K) int32: the first `MAX_SIBLINGS` children of each node in index order,
    -1 padded; `parents` (N,) or (B, N)."""
    p = check_parents(parents)
    rows = p.reshape(-1, p.shape[-1])
    kids = [[[] for _ in range(rows.shape[1])] for _ in rows]
    for b, row in enumerate(rows):
        for j in range(1, row.size):
            if row[j] >= 0 and len(kids[b][row[j]]) < MAX_SIBLINGS:
                kids[b][row[j]].append(j)
    k = max(1, max(len(c) for r in kids for c in r))
    table = np.full((rows.shape[0], rows.shape[1], k), -1, dtype=np.int32)
    for b, r in enumerate(kids):
        for i, c in enumerate(r):
            table[b, i, : len(c)] = c
    return table.reshape(*p.shape, k)


def tree_depths(parents) -> np.ndarray:
    """(..., N) int32 depth of each node (the root and padding are 0)."""
    p = check_parents(parents)
    rows = p.reshape(-1, p.shape[-1])
    d = np.zeros(rows.shape, dtype=np.int32)
    for j in range(1, rows.shape[1]):
        real = rows[:, j] >= 0
        d[real, j] = d[real, rows[real, j]] + 1
    return d.reshape(p.shape)
