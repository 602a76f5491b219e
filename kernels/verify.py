"""Token-tree verification: which draft nodes the target accepts, and the token that follows.

One operation, three implementations with one signature (mlx-lm's `gated_delta.py` pattern):
`verify_ops` (pure MLX, runs everywhere; the reference), `verify_cuda` (kernels/verify_cuda.py)
and `verify_metal` (kernels/verify_metal.py). `verify` picks one. The tree they take and the
record they return are kernels/tree.py's; the GPU backends share kernels/launch.py.

A chain is the tree with `parents = [-1, 0, 1, ...]`. Node 0 is the root (the last committed
token; its own token is not verified). `logits[:, c]` is the target's prediction after node `c`.
`parents` is one tree for every row, (N,), or one per row, (B, N); a row with fewer nodes
marks the rest as padding with parent `PAD` (never a child, never reached).

Rules (lossless):
    greedy: walk from the root; at node `c` follow the first child whose token equals
        argmax(logits[c]); the next token is the argmax at the deepest accepted node.
    sampling (recursive rejection sampling, SpecInfer / EAGLE): at an accepted node `c`,
        p = softmax(logits[c]); for each child j in index order, accept with probability
        min(1, p(x_j) / q_j(x_j)); on rejection p <- normalize(max(0, p - q_j)) and try the
        next sibling. When no child is accepted the next token is sampled from p (the residual
        after rejections, or the target itself at a leaf: the bonus token).
    `q_j` is `draft_probs[:, j]`, the distribution node j was drawn from; None means a
    deterministic drafter (q one-hot on the token), which makes rejection zero out x_j.

The residual / bonus token is drawn by an exponential race, argmin_v E_v / R(v), whose
E_v = -log U_v come from a counter hash of (seed, v) with the seed taken from the node's
uniform: an argmin is exact in any reduction order, so kernels and reference pick the same
token (an inverse CDF depends on the float summation order over the vocabulary).

Only the first `MAX_SIBLINGS` children of a node are tried (the kernels keep per-sibling
state in fixed shared memory); never trying a candidate keeps the result lossless.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from .tree import PAD, VerifyResult, children_table, per_row, tree_depths


def draw_uniforms(batch: int, num_nodes: int, key: mx.array | None = None) -> mx.array:
    """(B, N, 2) float32 uniforms in [0, 1): [..., 0] tests node j as a child, [..., 1]
    samples the token after node c when the walk stops there."""
    return mx.random.uniform(shape=(batch, num_nodes, 2), key=key)


def verify_ops(
    logits: mx.array,
    tokens: mx.array,
    parents,
    draft_probs: mx.array | None,
    uniforms: mx.array | None,
    greedy: bool,
) -> VerifyResult:
    """Pure-MLX reference (vectorised over every node at once, one step per sibling rank).

    Args:
        logits: (B, N, V) target logits per node, already temperature-scaled and filtered
            (-inf outside top-k / top-p).
        tokens: (B, N) int32 node tokens (tokens[:, 0], the root, is not verified).
        parents: (N,) or (B, N) int32 parent index per node (parents[0] == -1,
            parents[j] < j; `PAD` marks padding nodes of a row).
        draft_probs: (B, N, V) distribution each node was drawn from, or None (one-hot).
        uniforms: (B, N, 2) float32 in [0, 1) (see `draw_uniforms`); unused under greedy.
        greedy: argmax acceptance when True, rejection sampling otherwise.
    """
    B, N, V = logits.shape
    rows = per_row(parents, B)
    table = children_table(rows)  # (B, N, K)
    depth = int(tree_depths(rows).max())
    tokens = tokens.astype(mx.int32)
    lf = logits.astype(mx.float32)  # (B, N, V)
    child = mx.full((B, N), -1, dtype=mx.int32)
    searching = mx.ones((B, N), dtype=mx.bool_)
    if greedy:
        am = mx.argmax(lf, axis=-1).astype(mx.int32)  # (B, N)
        for k in range(table.shape[-1]):
            ch = mx.array(table[..., k])  # (B, N)
            valid = ch >= 0
            x = mx.take_along_axis(tokens, mx.maximum(ch, 0), axis=1)  # (B, N)
            acc = searching & valid & (x == am)
            child = mx.where(acc, ch, child)
            searching = searching & ~acc
        choice = am
    else:
        if uniforms is None:
            raise ValueError("sampling verification needs uniforms (see draw_uniforms)")
        uf = uniforms.astype(mx.float32)
        R = mx.exp(lf - mx.max(lf, axis=-1, keepdims=True))  # (B, N, V) unnormalised p
        M = mx.sum(R, axis=-1)  # (B, N) its mass
        vocab = mx.arange(V, dtype=mx.int32)
        for k in range(table.shape[-1]):
            ch = mx.array(table[..., k])  # (B, N)
            valid = ch >= 0
            chc = mx.maximum(ch, 0)
            x = mx.take_along_axis(tokens, chc, axis=1)  # (B, N)
            rx = mx.take_along_axis(R, x[..., None], axis=-1)[..., 0]  # (B, N)
            u = mx.take_along_axis(uf[..., 0], chc, axis=1)  # (B, N)
            if draft_probs is None:
                qx = mx.ones_like(rx)
            else:
                q = mx.take_along_axis(draft_probs, chc[..., None], axis=1).astype(mx.float32)
                qx = mx.take_along_axis(q, x[..., None], axis=-1)[..., 0]
            acc = searching & valid & ((u * qx) * M < rx)
            rej = searching & valid & ~acc
            child = mx.where(acc, ch, child)
            searching = searching & ~acc
            if draft_probs is None:
                R = mx.where(rej[..., None] & (vocab == x[..., None]), 0.0, R)
                M = mx.where(rej, M - rx, M)
            else:
                R = mx.where(rej[..., None], mx.maximum(R - M[..., None] * q, 0.0), R)
                M = mx.where(rej, mx.sum(R, axis=-1), M)
        sample = _race_sample(R, uf[..., 1])  # (B, N), lazy: only computed if read
        taken = mx.take_along_axis(tokens, mx.maximum(child, 0), axis=1)  # (B, N)
        choice = mx.where(child >= 0, taken, sample)

        def next_at(cur: mx.array) -> mx.array:
            # The deepest accepted node has no accepted child: race over its row only, so
            # a caller reading just next_token pays for one row, not N.
            r = mx.take_along_axis(R, cur[:, None, None], axis=1)  # (B, 1, V)
            u1 = mx.take_along_axis(uf[..., 1], cur[:, None], axis=1)  # (B, 1)
            return _race_sample(r, u1)[:, 0]

        return walk_ops(choice, child, depth, next_at)
    return walk_ops(choice, child, depth)


def race_keys(seed: mx.array, V: int) -> mx.array:
    """(..., V) float32 Exp(1) variates E_v = -log U_v from a counter hash of (seed, v).

    `seed` is (...) uint32. The hash (lowbias32 of seed ^ v * golden ratio) is repeated
    bit for bit in the kernels."""
    x = seed[..., None] ^ (mx.arange(V, dtype=mx.uint32) * 0x9E3779B9)
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    x = x ^ (x >> 16)
    u = ((x >> 8) + 1).astype(mx.float32) * (2.0**-24)  # (0, 1]
    return -mx.log(u)


def _race_sample(R: mx.array, u: mx.array) -> mx.array:
    """(B, N) a token drawn with probability R / sum(R): argmin_v E_v / R(v)."""
    seed = (u * 4294967296.0).astype(mx.uint32)  # (B, N), exact: u * 2^32 < 2^32
    E = race_keys(seed, R.shape[-1])  # (B, N, V)
    key = mx.where(R > 0, E / R, mx.inf)
    return mx.argmin(key, axis=-1).astype(mx.int32)


def walk_ops(choice: mx.array, child: mx.array, depth: int, next_at=None) -> VerifyResult:
    """Follow accepted children from the root: the path, its length and the next token
    (`next_at(cur)` computes it from the deepest accepted node, else it is read off choice)."""
    B, N = child.shape
    cur = mx.zeros((B,), dtype=mx.int32)
    alive = mx.ones((B,), dtype=mx.bool_)
    cols = [cur]
    for _ in range(min(depth, N - 1)):
        nxt = mx.take_along_axis(child, cur[:, None], axis=1)[:, 0]
        alive = alive & (nxt >= 0)
        cur = mx.where(alive, nxt, cur)
        cols.append(mx.where(alive, nxt, -1))
    path = mx.stack(cols, axis=1)  # (B, depth + 1)
    if path.shape[1] < N:
        path = mx.concatenate([path, mx.full((B, N - path.shape[1]), -1, mx.int32)], axis=1)
    num = mx.sum(path >= 0, axis=1).astype(mx.int32) - 1
    accepted = mx.any(path[:, :, None] == mx.arange(N)[None, None, :], axis=1)  # (B, N)
    if next_at is not None:
        nxt_tok = next_at(cur)
    else:
        nxt_tok = mx.take_along_axis(choice, cur[:, None], axis=1)[:, 0]
    return VerifyResult(choice, child, accepted, path.astype(mx.int32), num, nxt_tok)


def _backend() -> str:
    if mx.default_device().type != mx.DeviceType.gpu:
        return "ops"
    from . import verify_cuda, verify_metal

    if verify_cuda.available():
        return "cuda"
    if verify_metal.available():
        return "metal"
    return "ops"


def verify(
    logits: mx.array,
    tokens: mx.array,
    parents,
    draft_probs: mx.array | None = None,
    uniforms: mx.array | None = None,
    greedy: bool = True,
    backend: str | None = None,
) -> VerifyResult:
    """Verify a token tree with the fastest implementation present (see `verify_ops`).

    `backend` forces "ops", "cuda" or "metal"; by default the GPU kernel of the current
    device is used and the pure-MLX reference on the CPU.
    """
    backend = backend or _backend()
    if not greedy and uniforms is None:
        uniforms = draw_uniforms(tokens.shape[0], tokens.shape[1])
    if backend == "ops":
        return verify_ops(logits, tokens, parents, draft_probs, uniforms, greedy)
    if backend == "cuda":
        from .verify_cuda import verify_cuda

        return verify_cuda(logits, tokens, parents, draft_probs, uniforms, greedy)
    if backend == "metal":
        from .verify_metal import verify_metal

        return verify_metal(logits, tokens, parents, draft_probs, uniforms, greedy)
    raise ValueError(f"unknown verify backend {backend!r} (ops, cuda or metal)")


def choose(
    logits: mx.array, uniforms: mx.array | None = None, backend: str | None = None
) -> mx.array:
    """The target's token after each node, alone: (B, N, V) -> (B, N) int32.

    Greedy (`uniforms` None): the argmax. Otherwise the exponential race
    argmin_v E_v / p(v) with E drawn from each node's own uniform (`uniforms` (B, N), the
    seed that `draw_uniforms(...)[..., 1]` carries): the token `verify` samples at a leaf.
    Given per-position uniforms, this is coupled sampling: the same uniform picks the same
    token whichever draft came before, so drafts are verified by equality.
    """
    backend = backend or _backend()
    if backend == "ops":
        lf = logits.astype(mx.float32)
        if uniforms is None:
            return mx.argmax(lf, axis=-1).astype(mx.int32)
        R = mx.exp(lf - mx.max(lf, axis=-1, keepdims=True))
        return _race_sample(R, uniforms.astype(mx.float32))
    B, N, _ = logits.shape
    flat = np.full((B, N), PAD, dtype=np.int32)  # no children: every node is a leaf
    flat[:, 0] = -1
    u = None
    if uniforms is not None:
        u = mx.stack([mx.zeros_like(uniforms), uniforms.astype(mx.float32)], axis=-1)
    return verify(
        logits,
        tokens=mx.zeros((B, N), mx.int32),
        parents=flat,
        uniforms=u,
        greedy=uniforms is None,
        backend=backend,
    ).choice
