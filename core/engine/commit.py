"""After the target's forward: the tokens it chooses at every node, what each row keeps of
its draft (acceptance.walk, tree compaction, per-drafter statistics), emission with stop
sequences and log-probabilities, and finishing rows into results."""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from .acceptance import walk
from .draft_length import RowPolicy
from .grammar import apply_masks
from .packing import SegmentView, StepPlan, depths
from .results import GenerationResult, completed, result
from .sampling import adjust, choose, token_logprobs
from .sequence import Sequence
from .states import Span, gather


def choices(view: SegmentView, logits: mx.array):
    """The target's token after every node of a segment (packed, row-major), and the
    log-probabilities asked for (None when no row asked)."""
    logits = adjust(logits, view.adjust)
    if view.mask_nodes:
        logits = apply_masks(logits, view.mask_nodes, np.concatenate(view.mask_bits))
    picks = choose(logits, view.params, view.seeds, view.positions)
    lp = None
    if view.top_logprobs is not None:
        lp = token_logprobs(logits, view.params, picks, view.top_logprobs)
    return picks, lp


class Commit:
    """What a batch's rows keep of each step, and the rows that finish."""

    def __init__(self, batch):
        self.batch = batch
        self.done: list[Sequence] = []  # finished, results not yet built

    def verified(
        self,
        plan: StepPlan,
        picks: list[list[int]],
        views: list[SegmentView],
        lps: list,
        states: list | None = None,
    ) -> float:
        """Keep each row's accepted nodes; returns the seconds spent compacting caches.
        `states`: per view, the last-layer states of its nodes (rows keep those of the
        nodes they commit), or None."""
        b = self.batch
        dev_tokens = {
            name: d.tokens.tolist()
            for name, d in plan.drafts.items()
            if isinstance(d.tokens, mx.array)
        }
        # Per row: its choices (k + 1) from the segment it was verified in.
        row_choice: dict[int, list[int]] = {}
        row_node: dict[int, tuple[int, int]] = {}  # per row: (its view, its first node there)
        row_lp: dict[int, list] = {}  # per row, per node: the logprob record of its choice
        for v, (view, pick, lp) in enumerate(zip(views, picks, lps, strict=True)):
            off = 0
            for i, n in zip(view.index, view.sizes, strict=True):
                if i is not None:
                    row_choice[i] = pick[off : off + n]
                    row_node[i] = (v, off)
                    if lp is not None and plan.decode[i].params.logprobs:
                        row_lp[i] = [self.lp_record(lp, off + j, pick[off + j]) for j in range(n)]
                off += n
        paths: dict[str, list[list[int]]] = {name: [] for name in plan.drafts}
        kept: list[list[int]] = [[] for _ in views]  # per view: the committed nodes' states
        spans: dict[int, tuple[int, int, int]] = {}  # per row: (view, first in kept, count)
        moves_rows, moves_paths = [], []
        finished: list[tuple[Sequence, str]] = []
        B = len(plan.decode)
        for i, s in enumerate(plan.decode):
            d = plan.choice[i]
            draft = plan.drafts.get(d.name) if d is not None else None
            j = plan.members[d.name].index(i) if draft is not None else -1
            if draft is not None:
                k = draft.sizes[j]
                toks = dev_tokens[d.name][j][:k] if d.name in dev_tokens else draft.host_tokens(j)
                parents = draft.parents[j][:k] if draft.parents is not None else None
            else:
                k, toks, parents = 0, [], None
            path, nxt = walk(toks, parents, row_choice[i])
            if draft is not None:
                paths[d.name].append(path)
            if states is not None:
                v, off = row_node[i]
                spans[i] = (v, len(kept[v]), 1 + len(path))
                kept[v] += [off] + [off + 1 + p for p in path]
            if parents is not None and path != list(range(len(path))):
                moves_rows.append(s.slot)
                moves_paths.append([0] + [p + 1 for p in path])
            # Per-position statistics: a chain proposes its length; a tree its depth.
            proposed = (
                len(toks) if parents is None else max(depths([-1] + [p + 1 for p in parents]))
            )
            for other in b.drafters:
                s.stats[other.name].observe(proposed if other is d else 0, len(path))
            emitted = [toks[p] for p in path] + [nxt]
            b.report.drafted += k
            b.report.accepted += len(path)
            s.metrics.record_step(  # a row whose nodes the gate dropped verified alone
                draft.source if draft is not None and k else "none", k, len(path), len(emitted)
            )
            s.batch_rows += B
            b.cache.lengths[s.slot] += 1 + len(path)
            lps = None
            if i in row_lp:  # the emitted tokens are the target's choices after these nodes
                nodes = [0] + [p + 1 for p in path]
                lps = [row_lp[i][n] for n in nodes]
            if s.grammar is not None:  # whether each emitted token was forced, in order
                s.grammar.single = [s.grammar.single[n] for n in [0] + [p + 1 for p in path]]
            reason = self.emit(s, emitted, lps)
            if reason is not None:
                finished.append((s, reason))
        if states is not None:
            self.keep_committed_states(plan.decode, states, kept, spans)
        c0 = time.perf_counter()
        if moves_rows:  # before the lengths moved on: compact reads them as the base
            for r, p in zip(moves_rows, moves_paths, strict=True):
                b.cache.lengths[r] -= len(p)
            b.cache.compact(moves_rows, moves_paths)
            for r, p in zip(moves_rows, moves_paths, strict=True):
                b.cache.lengths[r] += len(p)
            if b.config.profile:
                mx.eval(b.cache.state())
        cache_s = time.perf_counter() - c0
        for name, draft in plan.drafts.items():
            d = next(x for x in self.batch.drafters if x.name == name)
            d.commit([plan.decode[i] for i in plan.members[name]], draft, paths[name])
        for seq, reason in finished:  # after the drafters rolled back their state
            self.finish(seq, reason)
        return cache_s

    @staticmethod
    def keep_committed_states(decode, states, kept, spans) -> None:
        """Each decoding row keeps the states of the nodes it committed (root and accepted
        path, in order): one gather per verify segment, evaluated now so that the step's
        whole (N, D) states are not held for rows that read theirs later."""
        taken = [
            None if not idx else states[v][mx.array(np.asarray(idx, np.int32))]
            for v, idx in enumerate(kept)
        ]
        mx.async_eval([t for t in taken if t is not None])
        for i, s in enumerate(decode):
            v, a, n = spans[i]
            s.states.append(Span(taken[v], a, n))

    def emit(self, s: Sequence, tokens: list[int], lps: list | None) -> str | None:
        """Append a row's new tokens in order; the finish reason at the first that ends it
        (EOS, a stop sequence, max_tokens), else None. Tokens past it are dropped: a draft
        that crosses a stop sequence is cut there."""
        eos = self.batch.target.eos_token_ids
        stops = s.params.stop
        g = s.grammar
        for j, t in enumerate(tokens):
            if t in eos:
                return "stop"
            s.output.append(t)
            self.batch.emitted += 1
            if g is not None:
                g.emitted(t, j)
            if lps is not None:
                s.logprobs.append(lps[j])
            for stop in stops:
                if isinstance(stop, list) and s.output[-len(stop) :] == stop:
                    del s.output[-len(stop) :]  # the stop sequence is not part of the answer
                    del s.logprobs[len(s.output) :]
                    return "stop"
            if any(isinstance(x, str) for x in stops):
                text = self.batch.target.decode(s.output)
                cuts = [text.find(x) for x in stops if isinstance(x, str) and x in text]
                if cuts:
                    s.text_end = min(cuts)
                    return "stop"
            if len(s.output) >= s.max_tokens:
                return "length"
        return None

    def lp_record(self, lp, node: int, token: int) -> dict:
        """{"token", "id", "logprob", "top_logprobs"} of the token chosen at `node`."""
        picked, top_ids, top_lps = lp
        dec = self.batch.target.decode
        return {
            "token": dec([token]),
            "id": token,
            "logprob": picked[node],
            "top_logprobs": [
                {"token": dec([t]), "id": t, "logprob": v}
                for t, v in zip(top_ids[node], top_lps[node], strict=True)
            ],
        }

    def plain(self, rows: list[Sequence], tokens: list[int]) -> None:
        """A plain step's tokens, one a row (a row's first: its time to first token)."""
        now = time.perf_counter()
        B = len(rows)
        for s, t in zip(rows, tokens, strict=True):
            if s.finish_reason is not None:
                continue  # finished meanwhile: this token was computed for nothing
            first = not s.output
            if first:
                s.metrics.t_first = now
            else:
                s.metrics.record_step("none", 0, 0, 1)
                s.batch_rows += B
            reason = self.emit(s, [t], None)
            if reason is not None:
                self.finish(s, reason)
            elif first:
                self.admit_drafters(s)

    @staticmethod
    def keep_states(rows: list[Sequence], h: mx.array | None) -> None:
        """Row j of `rows` committed one position whose last-layer state is h[j]."""
        for j, s in enumerate(rows):
            s.states.append(Span(h, j, 1))

    def admit_drafters(self, s: Sequence) -> None:
        """A row has its first token: each drafter takes it on, with fresh statistics."""
        for d in self.batch.drafters:
            d.admit(s)
            s.stats[d.name] = RowPolicy(self.batch.engine.carried(d))

    def finish(self, s: Sequence, reason: str) -> None:
        """A row ends: its drafters let it go, a learning self-drafter takes its answer,
        its slot is free."""
        b = self.batch
        s.finish_reason = reason
        s.metrics.t_end = time.perf_counter()
        spans = s.read_states + s.states  # a learning feature head's pairs (before retire)
        for d in b.drafters:
            d.retire(s)
        learner = b.engine.learner
        if learner is not None:
            learner.observe(s.prompt, s.output, [gather(spans)] if spans else None)
        b.rows[s.slot] = None
        b.cache.release(s.slot)
        self.done.append(s)

    def results(self) -> list[GenerationResult]:
        """The results of the requests whose rows have all finished since the last call."""
        done, self.done = self.done, []
        b = self.batch
        return [result(seqs, b.target.decode, b.engine.learner) for seqs in completed(done)]
