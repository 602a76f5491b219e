"""One forward of the target (or a draft model) over many rows with ragged token counts.

A forward is a list of `Segment`s; each is a group of rows that add tokens to their cache
rows this step: decode rows verifying a draft chain or tree, rows prefilling a prompt chunk,
early-exit rows whose hidden states enter at a later layer. Token i of row r is a tree node
with a parent (a chain is the tree 0 <- 1 <- 2 ...; a prompt chunk is a chain); its RoPE
position is the row's cached length + its depth and it sees the row's cache plus its own
ancestors.

The tokens of every segment are packed into one (N, D) stream for the linear layers (norms,
projections, MLP, output head), so a row that drafts nothing does not pay for another row's
draft; attention runs per segment on the padded (R, W) layout with the segment's mask. The
K/V of the packed tokens are written straight into their rows' cache slots.

The attention, projections and MLP are the model's own mlx-lm modules (llama, qwen2, qwen3,
mistral); RoPE runs through the model's own `rope` module with every token as its own row,
so per-token positions keep mlx-lm's rope variants exact. On the CPU (float32) the
attention's softmax and the MLP's SwiGLU run through `cpu_math` (MLX's `exp` is scalar
there: a third of a decode step).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from . import cpu_math
from .cache import BatchKVCache, bucket

SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")
# The forward's implementation, in the key of kept cost surfaces (costs.machine_key): a
# change that alters what a forward costs makes every machine measure its surface again.
# 2: cpu_math's exp on the CPU.
VERSION = 2


def check_supported(model: nn.Module) -> None:
    """Raise ValueError unless this forward reproduces the model's own layers."""
    kind = getattr(getattr(model, "args", None), "model_type", None)
    if kind not in SUPPORTED:
        raise ValueError(
            f"the engine runs {', '.join(SUPPORTED)} models; {kind!r} is not one of them"
        )


@dataclass
class Segment:
    """Rows that add tokens to their cache rows in one forward.

    Attributes:
        rows: (R,) cache slots.
        tokens: per row, the token ids of its nodes (ragged; node 0 follows the cached
            prefix). With `hidden`, they only give the node counts.
        parents: per row, each node's parent index (-1 for node 0, and for any other node
            that follows the cached prefix directly: a forest), or None for chains.
        ids: (N,) int32 packed token ids on the device (drafts a model sampled), used
            instead of `tokens`' values; None = embed `tokens`.
        hidden: (N, D) packed hidden states at `start_layer` (early exit), else None.
        start_layer: the first layer run for these rows.
        logits: "all" = logits after every node, "last" = after each row's last node,
            "none" = no logits (K/V only: a prefill chunk that does not end the prompt).
        base: (R,) int32 the rows' cache lengths on the device, used instead of the host's
            `cache.lengths`: positions, write slots and the mask are then derived on the
            device (the resident loop, resident.py, whose lengths the host learns a step
            late). Chains of one node count only; `end` bounds where they end.
        end: with `base`, an upper bound of base + node count over the rows (the read
            width and the room reserved come from it).
    """

    rows: list[int]
    tokens: list[list[int]]
    parents: list[list[int]] | None = None
    ids: mx.array | None = None
    hidden: mx.array | None = None
    start_layer: int = 0
    logits: str = "all"
    min_w: int = 1  # attention's query count at least this (a fixed shape)
    base: mx.array | None = None
    end: int = 0

    @property
    def sizes(self) -> list[int]:
        return [len(t) for t in self.tokens]

    @property
    def n(self) -> int:
        return sum(len(t) for t in self.tokens)

    def reach(self, lengths: np.ndarray) -> int:
        """Where its furthest row ends in the cache (`lengths`: the host's, per slot)."""
        if self.base is not None:
            return self.end
        return int((lengths[self.rows] + self.sizes).max())

    def depth(self) -> list[np.ndarray]:
        """Per row, each node's depth (the root's is 0)."""
        out = []
        for i, s in enumerate(self.sizes):
            if self.parents is None:
                out.append(np.arange(s))
            else:
                d = np.zeros(s, dtype=np.int64)
                for j, p in enumerate(self.parents[i][1:s], start=1):
                    d[j] = d[p] + 1 if p >= 0 else 0  # (a forest: several roots)
                out.append(d)
        return out


# What one more verify segment costs, in padded queries per row of the step: each segment
# gathers its rows' keys and values and runs its own attention (docs/decisions.md: segment
# merging). CUDA runs one segment of every slot.
SPLIT_QUERIES = 1.0  # padded queries per row of the step that a further segment costs


def merge_widths(buckets: list[tuple[list[int], int]]) -> list[list[int]]:
    """Rows grouped by node count into segments: `buckets` in order of width, each (its
    rows, its widest row's nodes); returned, the groups of rows that share a segment.
    Neighbouring buckets merge where the queries their padding adds (attention runs on the
    layout padded to a segment's widest row) cost less than a further segment
    (`SPLIT_QUERIES`): 33 one-node rows and 16 two-node rows share one; 48 one-node rows
    keep a nine-node row apart."""
    n = len(buckets)
    if n < 2:
        return [sorted(rows) for rows, _ in buckets]
    split = SPLIT_QUERIES * sum(len(rows) for rows, _ in buckets)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            count = sum(len(r) for r, _ in buckets[i:j])
            cost = best[i] + count * max(w for _, w in buckets[i:j]) + (split if i else 0.0)
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j:
        i = cut[j]
        groups.append(sorted(r for rows, _ in buckets[i:j] for r in rows))
        j = i
    return groups[::-1]


@dataclass
class _Plan:
    """Index arrays for one segment (built on the host once per forward)."""

    seg: Segment
    offset: int  # where its tokens start in the packed stream
    width: int  # key positions read per row
    w: int  # padded nodes per row
    rows_all: bool  # its queries cover the first q_rows slots in order: read without a gather
    q_rows: int  # query rows: R, or the first slots (rows_all) with the others' queries dummies
    rows: mx.array  # (R,)
    tok_rows: mx.array  # (N,) cache row of each packed token
    tok_slots: mx.array  # (N,) cache slot of each packed token
    tok_rows_np: np.ndarray  # the same two on the host
    tok_slots_np: np.ndarray | None  # (None: derived on the device, `Segment.base`)
    positions: mx.array  # (N,) RoPE position of each packed token
    unpack: mx.array | None  # (Q * W,) packed index per padded position (None: identity)
    pack: mx.array | None  # (N,) padded index per packed token (None: identity)
    mask: mx.array  # (Q, 1, W, width) bool; Q = q_rows
    keep: mx.array | None = None  # the mask as 1.0/0.0 (cpu_math's attention), built once
    lane: bool = False  # its one row lives in a lane of its own (cache.py), not the dense block


LONG = 16  # query counts above this (prompt chunks) are padded like the key reads


def _plan(cache: BatchKVCache, seg: Segment, offset: int) -> _Plan:
    if seg.base is not None:
        return _device_plan(cache, seg, offset)
    R, w = len(seg.rows), max(max(seg.sizes), seg.min_w)
    if w > LONG:  # CUDA: a few query counts, not one per prompt length
        w = bucket(w, cache.pad)
    lengths = cache.lengths[seg.rows]  # (R,)
    ends = lengths + np.asarray(seg.sizes)
    width = cache.read_width(int(ends.max()))
    sizes = np.asarray(seg.sizes)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    within = np.arange(int(sizes.sum())) - np.repeat(starts, sizes)  # each node's index in its row
    depths = within if seg.parents is None else np.concatenate(seg.depth())
    tok_rows = np.repeat(np.asarray(seg.rows), sizes)
    tok_slots = np.repeat(lengths, sizes) + within
    positions = np.repeat(lengths, sizes) + depths
    # Mask: node t of row r sees the row's prefix and its own ancestors (itself included);
    # a padded query sees one key (the row's first node): its output is never read.
    t = np.arange(w)
    real = t[None, :, None] < sizes[:, None, None]  # (R, w, 1)
    rel = (np.arange(width)[None, :] - lengths[:, None])[:, None, :]  # (R, 1, width): key - length
    if seg.parents is None:  # node t sees keys up to its own; a padded one up to node 0
        mask = rel <= np.where(real, t[None, :, None], 0)
    else:  # ancestors depth by depth (a node sees what its parent sees), then placed per node
        anc = np.zeros((R, w, w), dtype=bool)
        anc[:, t, t] = real[:, :, 0]
        anc[:, :, 0] |= ~real[:, :, 0]
        par = np.full((R, w), -1)
        dep = np.full((R, w), -1)
        rr = np.repeat(np.arange(R), sizes)
        par[rr, within] = np.concatenate(
            [np.asarray(p[:n]) for p, n in zip(seg.parents, sizes, strict=True)]
        )
        dep[rr, within] = depths
        for d in range(1, int(depths.max(initial=0)) + 1):
            i, j = np.nonzero((dep == d) & (par >= 0))
            anc[i, j] |= anc[i, par[i, j]]
        mask = np.broadcast_to(rel < 0, (R, w, width)).copy()
        for u in range(w):  # key column lengths[i] + u holds row i's node u
            i = np.nonzero(lengths + u < width)[0]
            mask[i, :, lengths[i] + u] = anc[i, :, u]
    ragged = any(s != w for s in seg.sizes)  # (padded queries read a copy of the last token)
    at = np.arange(R)  # each row's query row
    q_rows = R
    # Rows take the lowest free slots, so the live ones are mostly the first `hi` slots
    # (a batch's capacity may exceed the rows it has: a job's tail, a small job).
    hi = int(max(seg.rows)) + 1
    lane = cache.is_lane(seg.rows[0])
    rows_all = list(seg.rows) == list(range(hi)) and not lane
    if not rows_all and not lane and w <= LONG and 2 * R > hi:
        # Most of those slots verify here: gathering their keys and values would copy
        # nearly all of them every layer. Read the first `hi` slots instead; the other
        # slots' queries are dummies (they see one key, their output is dropped).
        q_rows, at, rows_all, ragged = hi, np.asarray(seg.rows), True, True
        full = np.zeros((q_rows, w, width), dtype=bool)
        full[:, :, 0] = True
        full[at] = mask
        mask = full
    if ragged:
        unpack = np.zeros((q_rows, w), dtype=np.int64)  # dummy queries: the first token
        unpack[at] = starts[:, None] + np.minimum(t[None, :], sizes[:, None] - 1)
        unpack = unpack.reshape(-1)
        pack = np.repeat(at * w, sizes) + within
    return _Plan(
        seg=seg,
        offset=offset,
        width=width,
        w=w,
        rows_all=rows_all,
        q_rows=q_rows,
        rows=mx.array(np.asarray(seg.rows, dtype=np.int32)),
        tok_rows=mx.array(tok_rows.astype(np.int32)),
        tok_slots=mx.array(tok_slots.astype(np.int32)),
        tok_rows_np=tok_rows.astype(np.int32),
        tok_slots_np=tok_slots.astype(np.int32),
        positions=mx.array(positions.astype(np.int32)),
        unpack=mx.array(unpack.astype(np.int32)) if ragged else None,
        pack=mx.array(pack.astype(np.int32)) if ragged else None,
        mask=mx.array(mask[:, None]),
        lane=lane,
    )


def _device_plan(cache: BatchKVCache, seg: Segment, offset: int) -> _Plan:
    """`_plan` for a segment whose lengths live on the device (`Segment.base`): every row
    a chain of the same node count; node t of a row sits at its length + t and sees keys
    up to its own position."""
    w = seg.sizes[0]
    if seg.parents is not None or any(n != w for n in seg.sizes) or w < seg.min_w:
        raise ValueError("a segment with device lengths holds chains of one node count")
    R = len(seg.rows)
    width = cache.read_width(seg.end)
    at = seg.base.astype(mx.int32)[:, None] + mx.arange(w, dtype=mx.int32)[None, :]  # (R, w)
    mask = mx.arange(width, dtype=mx.int32)[None, None, :] <= at[:, :, None]  # (R, w, width)
    tok_rows = np.repeat(np.asarray(seg.rows, np.int32), w)
    hi = int(max(seg.rows)) + 1
    return _Plan(
        seg=seg,
        offset=offset,
        width=width,
        w=w,
        rows_all=list(seg.rows) == list(range(hi)),
        q_rows=R,
        rows=mx.array(np.asarray(seg.rows, dtype=np.int32)),
        tok_rows=mx.array(tok_rows),
        tok_slots=at.reshape(-1),
        tok_rows_np=tok_rows,
        tok_slots_np=None,
        positions=at.reshape(-1),
        unpack=None,
        pack=None,
        mask=mask[:, None],
    )


def _rope(rope: nn.Module, x: mx.array, positions: mx.array) -> mx.array:
    """The model's RoPE on packed (N, H, D) at per-token positions (N,)."""
    N, H, D = x.shape
    return rope(x.reshape(N, H, 1, D), offset=positions).reshape(N, H, D)


@dataclass
class _Writes:
    """Where the packed tokens of a forward's live segments go in the cache."""

    dense: tuple[mx.array, mx.array, mx.array | None] | None  # (rows, slots, kept tokens)
    lanes: list[tuple[int, int, int, int]]  # (row, first position, packed lo, packed hi)


def _writes(plans: list[_Plan]) -> _Writes:
    """The cache writes for the packed tokens of `plans`: one scatter into the dense block
    (rows, slots, kept tokens), and a slice per lane row. A dense position written twice (a
    dummy token of CUDA's all-slot segment where a prefill chunk starts) keeps the later
    segment's token, as writing segment by segment would."""
    lanes = [
        (p.seg.rows[0], int(p.tok_slots_np[0]), p.offset, p.offset + p.seg.n)
        for p in plans
        if p.lane
    ]
    dense = [p for p in plans if not p.lane]
    if not dense:
        return _Writes(None, lanes)
    if len(dense) == len(plans) == 1:
        return _Writes((plans[0].tok_rows, plans[0].tok_slots, None), lanes)
    if any(p.tok_slots_np is None for p in plans):
        raise ValueError("a segment with device lengths runs alone in its forward")
    rows = np.concatenate([p.tok_rows_np for p in dense])
    slots = np.concatenate([p.tok_slots_np for p in dense])
    packed = np.concatenate([np.arange(p.offset, p.offset + p.seg.n) for p in dense])
    key = rows.astype(np.int64) * (1 << 32) + slots
    _, last = np.unique(key[::-1], return_index=True)
    keep = np.sort(len(key) - 1 - last)
    whole = len(keep) == len(key) and len(dense) == len(plans)
    idx = None if whole else mx.array(packed[keep].astype(np.int32))
    return _Writes((mx.array(rows[keep]), mx.array(slots[keep]), idx), lanes)


def _attention(
    attn: nn.Module, x: mx.array, plans: list[_Plan], cache, layer: int, writes
) -> mx.array:
    """mlx-lm llama/qwen attention over packed tokens (N, D), per segment, into the cache
    (`writes`: `_writes(plans)`)."""
    N = x.shape[0]
    q = attn.q_proj(x).reshape(N, attn.n_heads, -1)
    k = attn.k_proj(x).reshape(N, attn.n_kv_heads, -1)
    v = attn.v_proj(x).reshape(N, attn.n_kv_heads, -1)
    if hasattr(attn, "q_norm"):  # qwen3
        q, k = attn.q_norm(q), attn.k_norm(k)
    positions = (
        plans[0].positions if len(plans) == 1 else mx.concatenate([p.positions for p in plans])
    )
    q, k = _rope(attn.rope, q, positions), _rope(attn.rope, k, positions)
    # Every segment's K/V in one write before any read: a write after another segment's
    # read could not update the cache in place (MLX would copy the whole layer's cache).
    if writes.dense is not None:
        rows, slots, keep = writes.dense
        cache.write(
            layer, rows, slots, k if keep is None else k[keep], v if keep is None else v[keep]
        )
    for row, start, lo, hi in writes.lanes:
        cache.write_lane(layer, row, start, k[lo:hi], v[lo:hi])
    outs = []
    for p in plans:
        lo, hi = p.offset, p.offset + p.seg.n
        if p.lane:
            keys, values = cache.read_lane(layer, p.seg.rows[0], p.width)
        else:
            keys, values = cache.read(layer, p.q_rows if p.rows_all else p.rows, p.width)
        qs = q[lo:hi] if p.unpack is None else q[lo:hi][p.unpack]  # (Q * W, H, D)
        R = p.q_rows
        qs = qs.reshape(R, p.w, attn.n_heads, -1).transpose(0, 2, 1, 3)
        if cpu_math.applies(qs):
            if p.keep is None:
                p.keep = cpu_math.keep_mask(p.mask)
            o = cpu_math.attention(qs, keys, values, attn.scale, p.keep)
        else:
            o = mx.fast.scaled_dot_product_attention(
                qs, keys, values, scale=attn.scale, mask=p.mask
            )
        o = o.transpose(0, 2, 1, 3).reshape(R * p.w, -1)
        outs.append(o if p.pack is None else o[p.pack])
    o = outs[0] if len(outs) == 1 else mx.concatenate(outs)
    return attn.o_proj(o)


def head(model: nn.Module, h: mx.array) -> mx.array:
    """Final norm + output projection: (..., D) hidden states -> (..., V) logits."""
    h = model.model.norm(h)
    if hasattr(model, "lm_head"):
        return model.lm_head(h)
    return model.model.embed_tokens.as_linear(h)  # tied embeddings


def forward(
    model: nn.Module,
    cache: BatchKVCache,
    segments: list[Segment],
    stop: int | None = None,
    blocks: dict[int, nn.Module] | None = None,
    states: list | None = None,
) -> list[mx.array | None]:
    """Run `segments` through the model's layers [start, stop) writing their K/V.

    Returns, per segment, its logits: (N_seg, V) for "all", (R, V) for "last", None for
    "none"; with `stop` set (early-exit drafting), the hidden states at layer `stop`
    instead: (N_seg, D) packed.

    `blocks` (layer index -> a decoder layer) runs those layers instead of the model's own,
    reading and writing that layer's cache entries (a trained draft block); None (the
    default) runs the model's own layers.

    `states`, a list the caller passes, receives per segment the last layer's hidden
    states (before the final norm) where its logits are taken: (N_seg, D) for "all",
    (R, D) for "last", None for "none" (what a feature-head drafter reads).

    The cache lengths are not changed: the caller commits what it keeps.
    """
    _prepare(cache, segments)
    split, parts = _split_lanes(cache, segments)
    inner: list | None = [] if states is not None else None
    out = _forward(model, cache, split, stop, blocks, inner)
    if states is not None:
        states.extend(_merge(inner, parts))
    return _merge(out, parts, hidden=stop is not None and stop < len(model.model.layers))


def _prepare(cache: BatchKVCache, segments: list[Segment]) -> None:
    """Room in the cache for every row's reach this forward (lanes for the long rows)."""
    rows, ends = [], []
    for s in segments:
        rows += list(s.rows)
        if s.base is not None:
            ends += [s.end] * len(s.rows)
        else:
            ends += (cache.lengths[s.rows] + np.asarray(s.sizes)).tolist()
    cache.prepare(rows, ends)


def _split_lanes(cache: BatchKVCache, segments: list[Segment]):
    """Segments with a lane row split so that each lane row is a segment of its own.

    Returns the new segments and, per original segment, None (kept whole) or (its parts'
    indices in the new list, the order that puts the parts' concatenated packed tokens
    back, the same for rows)."""
    if not cache.lanes:
        return segments, [None] * len(segments)
    out: list[Segment] = []
    parts: list = []
    for seg in segments:
        lanes = [i for i, r in enumerate(seg.rows) if cache.is_lane(r)]
        if not lanes or len(seg.rows) == 1:
            parts.append(None)
            out.append(seg)
            continue
        if seg.base is not None:
            raise ValueError("a segment with device lengths holds no lane rows")
        groups = [[i for i in range(len(seg.rows)) if i not in lanes]] + [[i] for i in lanes]
        groups = [g for g in groups if g]
        starts = np.concatenate([[0], np.cumsum(seg.sizes)])
        idx, tok_order, row_order = [], [], []
        for g in groups:
            packed = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in g])
            take = mx.array(packed.astype(np.int32))
            idx.append(len(out))
            out.append(
                Segment(
                    rows=[seg.rows[i] for i in g],
                    tokens=[seg.tokens[i] for i in g],
                    parents=None if seg.parents is None else [seg.parents[i] for i in g],
                    ids=None if seg.ids is None else seg.ids[take],
                    hidden=None if seg.hidden is None else seg.hidden[take],
                    start_layer=seg.start_layer,
                    logits=seg.logits,
                    min_w=seg.min_w,
                )
            )
            tok_order.append(packed)
            row_order += g
        tok_back = mx.array(np.argsort(np.concatenate(tok_order)).astype(np.int32))
        row_back = mx.array(np.argsort(np.asarray(row_order)).astype(np.int32))
        parts.append((idx, tok_back, row_back if seg.logits == "last" else tok_back))
    return out, parts


def _merge(outs: list, parts: list, hidden: bool = False) -> list:
    """`_forward`'s outputs for the split segments, back in the original segments' order
    (`hidden`: they are every token's hidden states, whatever the segments' logits)."""
    if all(p is None for p in parts):
        return outs
    merged, j = [], 0
    for p in parts:
        if p is None:
            merged.append(outs[j])
            j += 1
            continue
        idx, tok_back, back = p
        back = tok_back if hidden else back
        got = [outs[i] for i in idx]
        j = idx[-1] + 1
        merged.append(None if got[0] is None else mx.concatenate(got)[back])
    return merged


def _forward(
    model: nn.Module,
    cache: BatchKVCache,
    segments: list[Segment],
    stop: int | None,
    blocks: dict[int, nn.Module] | None,
    states: list | None,
) -> list[mx.array | None]:
    layers = model.model.layers
    stop = len(layers) if stop is None else stop
    order = sorted(range(len(segments)), key=lambda j: segments[j].start_layer)
    plans: dict[int, _Plan] = {}
    h = None
    offset = 0
    for j in order:  # packed in order of the layer they enter at
        plans[j] = _plan(cache, segments[j], offset)
        offset += segments[j].n
    ordered = [plans[j] for j in order]
    writes_for: list[_Plan] = []
    writes = None
    for i in range(segments[order[0]].start_layer, stop):
        for p in ordered:
            if p.seg.start_layer == i:
                x = p.seg.hidden
                if x is None:
                    ids = p.seg.ids
                    if ids is None:
                        ids = mx.array(
                            np.concatenate([np.asarray(t, np.int32) for t in p.seg.tokens])
                        )
                    x = model.model.embed_tokens(ids)
                h = x if h is None else mx.concatenate([h, x])
        live = [p for p in ordered if p.seg.start_layer <= i]
        if len(live) != len(writes_for):  # the live set grows as segments enter
            writes_for, writes = live, _writes(live)
        layer = blocks.get(i, layers[i]) if blocks else layers[i]
        h = h + _attention(layer.self_attn, layer.input_layernorm(h), live, cache, i, writes)
        x = layer.post_attention_layernorm(h)
        if cpu_math.applies(x) and cpu_math.is_swiglu_mlp(layer.mlp):
            h = h + cpu_math.mlp(layer.mlp, x)
        else:
            h = h + layer.mlp(x)
    out: list[mx.array | None] = []
    for j in range(len(segments)):
        p = plans[j]
        hs = h[p.offset : p.offset + p.seg.n]
        if stop < len(layers):
            out.append(hs)
            continue
        if p.seg.logits == "last":
            hs = hs[mx.array((np.cumsum(p.seg.sizes) - 1).astype(np.int32))]
        elif p.seg.logits != "all":
            hs = None
        out.append(None if hs is None else head(model, hs))
        if states is not None:
            states.append(hs)
    return out
