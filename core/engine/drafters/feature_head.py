"""Self-drafting with the EAGLE-style feature head (adapters/head.py): no target layer runs
per draft token, only the trained block over the target's own last-layer states.

The head reads pairs (h_p, x_{p+1}): the target's state at a committed position p (before
the final norm) and the token the target chose after it. Pair i of a row is position
len(prompt) - 1 + i with output token i, as in training. The engine keeps, per row, the
states of the positions it committed since the head last read them (`Sequence.states`,
filled by prefill, verify and plain steps alike, whichever drafter drafted), so the head
never misses a position.

Drafting a row: its unread pairs run through the block in one forward over the head's own
one-layer cache (per-row lengths, like the target's), the last one's predicted state gives
draft token 1 through the target's norm and head; deeper tokens feed the predicted state
back with the token just drafted (EAGLE's chain). The draft's own cache entries are then
dropped (the row's length goes back to its read pairs): the next read replaces them with
pairs built from the target's true states. Sampled rows draw with `sampling.choose` and the
target's per-position uniforms, like every model drafter, so a node is accepted exactly
when it equals the target's own token: lossless whatever the head learned.

A chain comes with the head's probability of each of its tokens (`Draft.confidence`, on the
device). Where verifying a token costs real time (a compute-bound step at a large batch) the
engine asks for `chances`: those probabilities, calibrated by how often this head's tokens of
like probability were accepted, decide which rows' nodes are verified (`draft_length.gate`),
so a confident row drafts and an unsure one does not.

With a width W > 1 (`--draft head:W`; `head` alone drafts a chain) a greedy row drafts a
token tree instead of a chain (EAGLE-2): each expanded node proposes its W likeliest tokens under the head, the W new
nodes of highest path probability (the product of the head's probabilities from the root)
are expanded at the next depth, and the row's k nodes of highest path probability go to
the verify step through the tree path. A chain is one such tree, so the k nodes kept hold
at least the chain's expected accepted length under the head's own probabilities. Each
depth runs the block once over the nodes on the paths to the nodes it expands (the tree
mask lets a node see only its ancestors and the row's read pairs); the tokens come to the
host once per depth. Sampled rows keep drafting a chain (W = 1 for them).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import numpy as np

from .. import states
from ..adapters.block import Adapter, draft_logits, reduced_logits
from ..adapters.head import weight_share
from ..cache import BatchKVCache
from ..confidence import ProbabilityBins
from ..costs import CONTEXT, best_ms
from ..draft_length import PRIORS
from ..sampling import choose
from ..scorer import Segment, forward
from ..tree import TokenTree, best_first
from .base import Draft

# The tree's width unless a spec says (`head:W`): a chain (docs/performance.md, `head:4`).
WIDTH = 1
KEEP_COMPACT = 16  # read spans kept per row (of the steps' outputs) before one buffer, at most


class FeatureHeadDrafter:
    kind = "early-exit"  # its prior (draft_length.PRIORS); statistics are kept by name
    lookup = False
    calibrated = False
    reads_states = True  # the engine keeps each row's committed states for it

    def __init__(
        self,
        target,
        capacity: int,
        adapter: Adapter,
        width: int = WIDTH,
        plain_ms: Callable[[int], float] | None = None,
        timings: dict[int, float] | None = None,
    ):
        self.target = target
        self.adapter = adapter
        self.width = width  # alternatives per expanded node: 1 = a chain
        self.name = "head"
        self.cache = BatchKVCache(1, capacity)  # the head block's keys and values
        self.keep = False  # keep the states read on the row (`read_states`): it learns online
        self.calibration = ProbabilityBins(weight=2.0)
        self._bins: dict[int, list[int]] = {}  # row uid -> its last chances' bins
        vocab = None if adapter.vocab is None else int(adapter.vocab.size)
        self._share = weight_share(target.model, vocab)
        self._plain_ms = plain_ms  # ms of one plain target step at a row count (its surface)
        # rows -> one drafting depth's ms, measured (`timings`: kept by the engine across
        # its batches, which share the capacity and so the shapes on CUDA)
        self._depth_ms: dict[int, float] = {} if timings is None else timings
        # The first draft token's held-out agreement; deeper ones keep the kind's guess (which
        # lets the engine try one deeper and measure them): the calibrated second-token
        # agreement reads the head's state after every target token, not only after accepted
        # drafts, so it is not the chance the engine tracks for a chain's second token.
        first = adapter.agreement
        self.prior = (first, *PRIORS[self.kind][1:]) if first > 0 else None

    def admit(self, seq) -> None:
        self.cache.lengths[seq.slot] = 0

    def propose(self, seqs, ks: list[int]) -> Draft:
        model, cache, fh = self.target.model, self.cache, self.adapter.block
        k_max = max(ks, default=0)
        tokens = mx.zeros((len(seqs), max(k_max, 1)), mx.int32)  # (R, K)
        live = [i for i, k in enumerate(ks) if k > 0]
        if not live:
            return Draft(sizes=list(ks), tokens=tokens, source=self.name)
        # Depth 0: the rows' unread pairs (h_p, x_{p+1}); the last one's prediction drafts.
        spans, ids, sizes = [], [], []
        for i in live:
            s = seqs[i]
            read = int(cache.lengths[s.slot])
            n, have = len(s.output) - read, states.count(s.states)
            if have != n:
                raise RuntimeError(f"row {s.slot}: {have} unread states for {n} tokens")
            spans += s.states
            if self.keep:
                self.keep_read(s, s.states)
            ids += s.output[read : read + n]
            sizes.append(n)
        x = fh.fuse(model, states.gather(spans), mx.array(ids, mx.int32))
        slots = [seqs[i].slot for i in live]
        pred = self._block(slots, sizes, x)  # (R', D)
        base = cache.lengths[slots] + np.asarray(sizes)
        cache.lengths[slots] = base
        if self.width > 1:
            draft = self._tree(seqs, ks, live, pred, base)
            self._read_all(seqs, ks)
            return draft
        # Greedy rows over a reduced vocabulary: the argmax of its logits, no (R', V) array.
        small = self.adapter.vocab is not None and all(seqs[i].params.greedy for i in live)
        sure = mx.zeros(tokens.shape, mx.float32)  # the head's probability of each token
        for depth in range(k_max):
            # The tokens come from the logits as they are; the probabilities (float32) are
            # computed only if the gate reads them (MLX evaluates lazily).
            if small:
                logits = reduced_logits(model, self.adapter, pred)
                best = mx.argmax(logits, axis=-1)
                drafted = self.adapter.vocab[best].astype(mx.int32)
                top = mx.max(logits, axis=-1)
            else:
                pos = np.array([len(seqs[i].history) + depth for i in live])
                seeds = np.array([seqs[i].seed for i in live], dtype=np.uint32)
                logits = draft_logits(model, self.adapter, pred)  # (R', V): -inf off its vocabulary
                drafted = choose(logits, [seqs[i].params for i in live], seeds, pos)
                top = mx.take_along_axis(logits, drafted[:, None], axis=-1)[:, 0]
            rows = mx.array(live)
            tokens[rows, depth] = drafted
            lse = mx.logsumexp(logits.astype(mx.float32), axis=-1)
            sure[rows, depth] = mx.exp(top.astype(mx.float32) - lse)
            nxt = [j for j, i in enumerate(live) if ks[i] > depth + 1]
            if not nxt:
                break
            if len(nxt) < len(live):
                sel = mx.array(nxt)
                pred, drafted, base = pred[sel], drafted[sel], base[nxt]
                live, slots = [live[j] for j in nxt], [slots[j] for j in nxt]
            cache.lengths[slots] = base + depth  # the chain's own entries, dropped below
            pred = self._block(slots, [1] * len(live), fh.fuse(model, pred, drafted))
        self._read_all(seqs, ks)
        return Draft(sizes=list(ks), tokens=tokens, confidence=sure, source=self.name)

    def keep_read(self, seq, spans: list) -> None:
        """A learning head keeps the states it read on the row (`Sequence.read_states`),
        gathered into one buffer now and then (the steps' outputs are let go)."""
        seq.read_states += spans
        if len(seq.read_states) >= KEEP_COMPACT:
            h = states.gather(seq.read_states)
            mx.async_eval(h)
            seq.read_states = [states.Span(h, 0, h.shape[0])]

    def _block(
        self, slots: list[int], sizes: list[int], x: mx.array, cache: BatchKVCache | None = None
    ) -> mx.array:
        """The head's block over `sizes[j]` new pairs of each of `slots` (packed in `x`,
        (sum(sizes), D)), into its cache (or `cache`): the predicted state after each slot's
        last pair, (len(slots), D).

        On CUDA (a padded cache) every slot takes part, in slot order, with a power-of-two
        query count, as in the verify step; a slot that drafts nothing runs one zero pair,
        written past its length (its next read writes there first) and dropped. Attention
        there builds a graph per exact shape (cache.py): the count of drafting rows changes
        nearly every step, the count of slots never, so the head meets a few shapes."""
        cache, model = cache or self.cache, self.target.model
        n = np.asarray(sizes)
        if cache.pad <= 1:
            seg = Segment(slots, [[0] * k for k in sizes], hidden=x)
            last = np.cumsum(n) - 1
        else:
            per = np.ones(cache.capacity, np.int64)  # pairs per slot: dummies run one
            per[slots] = n
            start = np.cumsum(per) - per  # each slot's first node in the packed stream
            src = np.full(int(per.sum()), x.shape[0], np.int32)  # the zero row by default
            within = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
            src[np.repeat(start[slots], n) + within] = np.arange(n.sum())
            hidden = mx.concatenate([x, mx.zeros((1, x.shape[1]), x.dtype)])[mx.array(src)]
            w = 1 << (int(n.max()) - 1).bit_length()
            seg = Segment(
                list(range(cache.capacity)), [[0] * k for k in per], hidden=hidden, min_w=w
            )
            last = start[slots] + n - 1
        out = forward(model, cache, [seg], stop=1, blocks={0: self.adapter.block.block})[0]
        return out[mx.array(last.astype(np.int32))]

    def next_tokens(self, pred: mx.array, params=None, seeds=None, positions=None) -> mx.array:
        """(R, D) predicted states -> (R,) int32 the head's token after each: its likeliest
        (greedy rows: `params` None), else drawn by `sampling.choose` with the rows'
        `params`, `seeds` and the tokens' (device) `positions`, as `propose` draws them."""
        model = self.target.model
        if params is not None:
            return choose(draft_logits(model, self.adapter, pred), params, seeds, positions)
        if self.adapter.vocab is None:
            return mx.argmax(draft_logits(model, self.adapter, pred), axis=-1).astype(mx.int32)
        best = mx.argmax(reduced_logits(model, self.adapter, pred), axis=-1)
        return self.adapter.vocab[best].astype(mx.int32)

    def chances(self, seqs, draft: Draft) -> list[list[float]]:
        """Each chain node's chance of being accepted with all before it, from the head's
        probability of its token calibrated by what this head's tokens of that probability
        were accepted (`confidence.ProbabilityBins`). Reads the draft back (a sync)."""
        probs = np.array(draft.confidence)
        bins = self.calibration.buckets(probs)
        chances = self.calibration.chances(bins)
        out = []
        for r, (s, n) in enumerate(zip(seqs, draft.sizes, strict=True)):
            self._bins[s.uid] = bins[r, :n].tolist()
            out.append(chances[r, :n].tolist())
        return out

    def _read_all(self, seqs, ks: list[int]) -> None:
        for i in [i for i, k in enumerate(ks) if k > 0]:
            s = seqs[i]
            self.cache.lengths[s.slot] = len(s.output)  # every pair read, the draft's dropped
            s.states = []

    def _tree(self, seqs, ks: list[int], live: list[int], pred: mx.array, base) -> Draft:
        """Per live row, the tree of its ks[i] likeliest nodes (module docstring). `pred`:
        (R', D) the predicted state at each live row's pending token; `base`: (R',) the
        rows' read lengths in the head's cache."""
        model, fh = self.target.model, self.adapter.block
        trees = {i: TokenTree.root(seqs[i].pending) for i in live}
        xs = None  # (n, D) the block inputs of every node expanded so far
        held: dict[tuple[int, int], int] = {}  # (row, node) -> its input's row in `xs`
        at = {i: int(b) for i, b in zip(live, base, strict=True)}
        frontier = [(i, 0) for i in live]  # (row, node) whose predicted state is in `pred`
        for depth in range(max(ks[i] for i in live)):
            raw = draft_logits(model, self.adapter, pred)  # (F, V)
            rows = [i for i, _ in frontier]
            first = choose(
                raw,
                [seqs[i].params for i in rows],
                np.array([seqs[i].seed for i in rows], dtype=np.uint32),
                np.array([len(seqs[i].history) + depth for i in rows]),
            )
            logits = raw.astype(mx.float32)
            w = min(self.width, logits.shape[-1])
            top = mx.argpartition(-logits, w - 1, axis=-1)[:, :w]  # (F, W)
            lse = mx.logsumexp(logits, axis=-1, keepdims=True)
            logp = mx.take_along_axis(logits, mx.concatenate([first[:, None], top], 1), 1) - lse
            mx.eval(first, top, logp)
            first_h, top_h, p_h = first.tolist(), top.tolist(), np.exp(np.array(logp))
            grown: dict[int, list[int]] = {}
            for f, (i, node) in enumerate(frontier):
                tree = trees[i]
                if seqs[i].params.greedy:  # its W likeliest, the best (`first`) first
                    ranked = sorted(range(w), key=lambda j: -p_h[f, 1 + j])
                    cands = [(top_h[f][j], p_h[f, 1 + j]) for j in ranked]
                else:
                    cands = [(first_h[f], p_h[f, 0])]
                for t, p in cands:
                    if not np.isfinite(p) or p <= 0.0:
                        continue
                    n = tree.add(node, t, tree.scores[node] * float(p))
                    grown.setdefault(i, []).append((f, n))
            nxt = []  # the nodes expanded at the next depth: each row's `width` likeliest
            for i, made in grown.items():
                if depth + 1 >= ks[i]:
                    continue
                made.sort(key=lambda fn: -trees[i].scores[fn[1]])
                nxt += [(i, f, n) for f, n in made[: self.width]]
            if not nxt:
                break
            # Their block inputs: the parent's predicted state with the node's token.
            x = fh.fuse(
                model,
                pred[mx.array([f for _, f, _ in nxt])],
                mx.array([trees[i].tokens[n] for i, _, n in nxt], mx.int32),
            )
            have = 0 if xs is None else xs.shape[0]
            held.update({(i, n): have + j for j, (i, _, n) in enumerate(nxt)})
            xs = x if xs is None else mx.concatenate([xs, x])
            # One block forward per row over the paths to its next nodes (root excluded).
            order: dict[int, set[int]] = {}
            for i, _, n in nxt:
                order.setdefault(i, set()).update(trees[i].path(n)[1:])
            seg_rows, seg_nodes, seg_parents, gather, where = [], [], [], [], {}
            for i, nodes in order.items():
                nodes = sorted(nodes)  # parents come first
                local = {n: j for j, n in enumerate(nodes)}
                seg_rows.append(seqs[i].slot)
                seg_nodes.append([0] * len(nodes))
                seg_parents.append([local.get(trees[i].parents[n], -1) for n in nodes])
                where.update({(i, n): len(gather) + j for n, j in local.items()})
                gather += [held[(i, n)] for n in nodes]
                self.cache.lengths[seqs[i].slot] = at[i]
            seg = Segment(seg_rows, seg_nodes, parents=seg_parents, hidden=xs[mx.array(gather)])
            out = forward(model, self.cache, [seg], stop=1, blocks={0: fh.block})[0]
            pred = out[mx.array([where[(i, n)] for i, _, n in nxt])]
            frontier = [(i, n) for i, _, n in nxt]
        sizes, tokens, parents, chances = [], [], [], []
        for i, k in enumerate(ks):
            tree = best_first(trees[i], k) if i in trees else TokenTree.root(0)
            sizes.append(tree.size - 1)
            tokens.append(tree.tokens[1:])
            parents.append([p - 1 for p in tree.parents[1:]])  # drafts-only: -1 = the root
            chances.append(tree.scores[1:])  # the head's probability of each node's path
        return Draft(sizes, tokens, parents=parents, chances=chances, source=self.name)

    def commit(self, seqs, draft: Draft, paths) -> None:
        # The pairs the verify step committed arrive through `Sequence.states`; the nodes
        # whose chances were asked for teach the calibration.
        for s, size, path in zip(seqs, draft.sizes, paths, strict=True):
            bins = self._bins.pop(s.uid, None)
            if bins and size:
                self.calibration.observe(bins[:size], len(path))

    def retire(self, seq) -> None:
        self._bins.pop(seq.uid, None)
        self.cache.lengths[seq.slot] = 0
        seq.states = []
        seq.read_states = []

    def step_cost(self, rows: int) -> float:
        """One drafting depth over `rows` rows (a block forward, the logits, the tokens), in
        plain target steps at that batch: timed on this machine at the powers of two around
        `rows` and interpolated, as the surface times the verify. On an accelerator running
        a small model a depth costs what launching its kernels does, whatever the rows; on
        a CPU its arithmetic, in proportion to them: neither is the share of the weights it
        reads, which stands in only where no plain step's cost is known."""
        if self._plain_ms is None:
            return self._share
        rows = max(rows, 1)
        lo = 1 << (rows.bit_length() - 1)
        hi = lo if lo == rows else min(2 * lo, max(self.cache.capacity, rows))
        a, b = self._measured_depth(lo), self._measured_depth(hi)
        ms = a + (b - a) * (rows - lo) / max(hi - lo, 1)
        return ms / self._plain_ms(rows)

    def _measured_depth(self, rows: int) -> float:
        """Milliseconds of one drafting depth over `rows` rows, each `costs.CONTEXT` pairs
        deep, on a scratch cache (timed once per row count)."""
        if rows not in self._depth_ms:
            model, fh = self.target.model, self.adapter.block
            cache = BatchKVCache(1, max(self.cache.capacity, rows), pad=self.cache.pad)
            slots = list(range(rows))
            D = model.args.hidden_size
            dtype = model.model.norm.weight.dtype
            cache.lengths[slots] = CONTEXT  # what the depths read: zeros, as good to time
            pred, tok = mx.zeros((rows, D), dtype), mx.zeros((rows,), mx.int32)

            def depth():
                h = self._block(slots, [1] * rows, fh.fuse(model, pred, tok), cache=cache)
                if self.adapter.vocab is not None:
                    return mx.argmax(reduced_logits(model, self.adapter, h), axis=-1)
                return mx.argmax(draft_logits(model, self.adapter, h), axis=-1)

            self._depth_ms[rows] = best_ms(depth)
        return self._depth_ms[rows]

    def evidence(self) -> int:
        return 0
