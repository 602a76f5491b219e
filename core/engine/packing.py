"""Drafts into verify segments: each step's drafting decisions (`StepPlan`) become the
target forward's segments (scorer.Segment), rows grouped by entry layer and node count, with
what choosing their tokens needs (`SegmentView`: per-node parameters, seeds, positions,
penalties, grammar masks)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np

from .drafters.base import Draft, Drafter
from .grammar import segment_masks
from .sampling import GenerationParams
from .scorer import Segment, merge_widths
from .sequence import Sequence

GREEDY = GenerationParams()


@dataclass
class SegmentView:
    """Which decoding rows a verify segment holds and how to choose their tokens."""

    index: list[int | None]  # rows of the step's decode list, in segment order (None: dummy)
    sizes: list[int]  # nodes per row (pending token + drafts)
    params: list[GenerationParams]  # per node
    seeds: np.ndarray  # (N,) per node
    positions: np.ndarray  # (N,) absolute position of the token chosen after each node
    adjust: list[tuple[int, int, float]] = field(default_factory=list)  # (node, token, delta)
    top_logprobs: int | None = None  # log-probabilities wanted (with this many alternatives)
    mask_nodes: list[int] = field(default_factory=list)  # nodes a grammar constrains
    mask_bits: list[np.ndarray] = field(default_factory=list)  # per row: (nodes, W) int32


@dataclass
class StepPlan:
    """One step's drafting decisions."""

    decode: list[Sequence]
    choice: list[Drafter | None]
    drafts: dict[str, Draft]
    members: dict[str, list[int]]  # drafter name -> rows of `decode` it drafted for
    drafters: list[Drafter]
    static: int | None = None  # every slot in one segment (CUDA): the batch's capacity

    def segments(self) -> Iterator[tuple[Segment, SegmentView]]:
        """The verify segments: rows grouped by the layer their tokens enter at (early exit
        enters late) and by their node count. Attention runs per segment on a layout padded
        to its longest row, so one 9-node row would make 31 one-node rows compute 9 queries
        each; in power-of-two buckets a row pays for less than twice its own nodes (the
        linear layers see every segment's tokens packed together either way). A segment
        costs something of its own too (its rows' keys and values gathered, its attention
        run): neighbouring buckets share one where their padding costs less
        (`scorer.merge_widths`)."""
        groups: dict[tuple[int, int], list[int]] = {}
        nodes: dict[int, int] = {}  # decode row -> its node count
        start_of = {}
        for name, draft in self.drafts.items():
            if draft.hidden is not None:
                start_of[name] = draft.start_layer
        for i, d in enumerate(self.choice):
            member = d is not None and i in self.members.get(d.name, [])
            start = start_of.get(d.name, 0) if member else 0
            nodes[i] = 1 + (
                self.drafts[d.name].sizes[self.members[d.name].index(i)] if member else 0
            )
            groups.setdefault((start, (nodes[i] - 1).bit_length()), []).append(i)
        if self.static and not start_of:
            # CUDA: attention graphs are built per shape (cuDNN), so every slot takes part,
            # in slot order, with a query count rounded to a power of two; slots with no
            # decoding row verify a dummy token whose result is dropped.
            by_slot = {self.decode[i].slot: i for i in range(len(self.decode))}
            entries = [(by_slot.get(slot), slot) for slot in range(self.static)]
            longest = max(g for _, g in groups) if groups else 0
            yield self._segment(entries, 0, min_w=1 << longest)
            return
        for start in sorted({s for s, _ in groups}):
            buckets = sorted((b, idx) for (s, b), idx in groups.items() if s == start)
            widths = [(idx, max(nodes[i] for i in idx)) for _, idx in buckets]
            for idx in merge_widths(widths):
                yield self._segment([(i, self.decode[i].slot) for i in idx], start)

    def _segment(
        self, entries: list[tuple[int | None, int]], start: int, min_w: int = 1
    ) -> tuple[Segment, SegmentView]:
        """A segment of (decode row or None for a dummy, slot) entries."""
        tokens, parents, sizes = [], [], []
        dev_src: list[tuple[str, int, int, int]] = []  # (drafter, segment row, its row, k)
        hidden = []
        any_tree = False
        params, seeds, positions = [], [], []
        idx = [i for i, _ in entries]
        adjust: list[tuple[int, int, float]] = []
        lp_k: int | None = None
        mask_nodes: list[int] = []
        masked: list[tuple[Any, list[int], list[int]]] = []  # (row grammar, nodes, parents)
        for r, (i, _slot) in enumerate(entries):
            if i is None:  # a dummy: one token, its logits unused
                tokens.append([0])
                parents.append([-1])
                sizes.append(1)
                params.append(GREEDY)
                seeds.append(0)
                positions.append(0)
                continue
            s = self.decode[i]
            d = self.choice[i]
            draft = self.drafts.get(d.name) if d is not None else None
            node_tokens, node_parents, k = [s.pending], [-1], 0
            if draft is not None:
                j = self.members[d.name].index(i)
                k = draft.sizes[j]
                if isinstance(draft.tokens, mx.array):
                    node_tokens += [0] * k  # filled on the device below
                    if k:
                        dev_src.append((d.name, r, j, k))
                else:
                    node_tokens += draft.host_tokens(j)
                if draft.parents is not None:
                    any_tree = True
                    node_parents += [p + 1 for p in draft.parents[j][:k]]
                else:
                    node_parents += list(range(k))
                if draft.hidden is not None:
                    hidden.append((d.name, j))
            if s.grammar is not None:  # the mask after each node, along the node's path
                host = node_tokens
                if isinstance(draft.tokens if draft is not None else None, mx.array):
                    host = [s.pending] + (draft.tokens[j, :k].tolist() if k else [])
                masked.append((s.grammar, host, node_parents))
                mask_nodes += range(len(params), len(params) + len(host))
            if s.params.adjusts or s.params.logprobs:
                node0 = len(params)
                if s.params.logprobs:
                    lp_k = max(lp_k or 0, s.params.top_logprobs)
                if s.params.adjusts:  # per node: the output so far + the draft tokens on its path
                    counts = Counter(s.output)
                    here = [Counter() for _ in node_tokens]
                    for j in range(1, len(node_tokens)):
                        here[j] = here[node_parents[j]] + Counter([node_tokens[j]])
                    for j in range(len(node_tokens)):
                        for t, delta in s.params.adjustments(counts + here[j]).items():
                            adjust.append((node0 + j, t, delta))
            tokens.append(node_tokens)
            parents.append(node_parents)
            sizes.append(k + 1)
            params += [s.params] * (k + 1)
            seeds += [s.seed] * (k + 1)
            positions += [len(s.history) + dd for dd in depths(node_parents)]
        mask_bits = segment_masks(masked) if masked else []
        for (g, _, _), bits in zip(masked, mask_bits, strict=True):
            g.single = [single(b) for b in bits]
        ids = None
        if dev_src:  # drafts still on the device: place them into the packed ids
            w = max(sizes)
            padded = mx.array(np.array([t + [0] * (w - len(t)) for t in tokens], np.int32))
            for name in {n for n, *_ in dev_src}:
                items = [(r, j, k) for n, r, j, k in dev_src if n == name]
                kk = max(k for *_, k in items)
                dt = self.drafts[name].tokens  # (R_d, K)
                rows = mx.array([r for r, _, _ in items])
                padded[rows, 1 : 1 + kk] = dt[mx.array([j for _, j, _ in items]), :kk]
            flat = np.concatenate([r * w + np.arange(n) for r, n in enumerate(sizes)])
            ids = padded.reshape(-1)[mx.array(flat.astype(np.int32))]
        hid = None
        if start > 0:
            parts = []
            for name, j in hidden:
                draft = self.drafts[name]
                offs = np.concatenate([[0], np.cumsum(np.asarray(draft.sizes) + 1)])
                parts.append(np.arange(offs[j], offs[j + 1]))
            hid = self.drafts[hidden[0][0]].hidden[mx.array(np.concatenate(parts).astype(np.int32))]
        seg = Segment(
            rows=[slot for _, slot in entries],
            tokens=tokens,
            parents=parents if any_tree else None,
            ids=ids,
            hidden=hid,
            start_layer=start,
            min_w=min_w,
        )
        view = SegmentView(
            idx,
            sizes,
            params,
            np.array(seeds, np.uint32),
            np.array(positions),
            adjust,
            lp_k,
            mask_nodes,
            mask_bits,
        )
        return seg, view


def single(bits: np.ndarray) -> bool:
    """Whether a node's mask allows one token only (the grammar forces it)."""
    words = bits.view(np.uint32)
    words = words[words != 0]
    return len(words) == 1 and int(words[0]) & (int(words[0]) - 1) == 0


def depths(parents: list[int]) -> list[int]:
    d = [0] * len(parents)
    for j in range(1, len(parents)):
        d[j] = d[parents[j]] + 1
    return d
