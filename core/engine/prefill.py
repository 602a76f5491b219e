"""Prompts into the cache: which chunks a step prefills, the prompt prefixes joining rows
copy from rows that hold them, and each row's first token once its prompt is in."""

from __future__ import annotations

import time
from collections import Counter

import mlx.core as mx
import numpy as np

from .grammar import apply_masks
from .packing import single
from .sampling import adjust, choose, token_logprobs
from .sequence import Sequence
from .states import Span


class Prefill:
    """A batch's prompt processing. Per slot it keeps its row's first `prompt_head` prompt
    tokens (-1 beyond them), which `shared` compares at once to find a prefix to copy."""

    def __init__(self, batch):
        self.batch = batch
        self.config = batch.config
        self.heads = np.full((batch.capacity, self.config.prompt_head), -1, np.int32)

    def plan(self) -> list[tuple[Sequence, list[int]]]:
        """The prompt chunks to prefill this step (at most `prefill_tokens` in all, oldest
        rows first). A joining row first copies the longest prompt prefix another row holds
        in the cache (a job's prompts share their template: the system prompt, the task's
        instructions); if a longer one is being prefilled this very step by another row, it
        waits a step and copies that instead of computing it too."""
        b, cfg = self.batch, self.config
        budget = cfg.prefill_tokens
        plan: list[tuple[Sequence, list[int]]] = []
        joining = sorted(
            (s for s in b.rows if s is not None and s.prefilled < len(s.prompt)),
            key=lambda s: s.t_admit,
        )
        copies: list[tuple[int, int, int]] = []  # (donor slot, slot, positions), made at once
        for s in joining:
            if budget <= 0:
                break
            if cfg.share_prefixes:
                ready, donor = self.shared(s, lambda o: o.cached if o.output else o.prefilled)
                if donor is not None and ready > s.prefilled:
                    if any(donor.slot == d for _, d, _ in copies):  # its prefix is copied first
                        b.cache.copy_prefixes(copies)
                        copies = []
                    copies.append((donor.slot, s.slot, ready))
                    s.metrics.shared_prefix += ready - s.prefilled
                    s.prefilled = ready
                coming = max((common(s, o, o.prefilled + len(c)) for o, c in plan), default=0)
                if coming >= s.prefilled + cfg.min_shared_prefix:
                    continue  # copied next step, once that row has it
            chunk = s.prompt[s.prefilled : s.prefilled + budget]
            plan.append((s, chunk))
            budget -= len(chunk)
        if copies:
            b.cache.copy_prefixes(copies)
        b.report.prefill_tokens += sum(len(c) for _, c in plan)
        return plan

    def shared(self, s: Sequence, cached_of) -> tuple[int, Sequence | None]:
        """The longest prefix of `s`'s prompt another row holds in the cache, and that row
        (the first such slot). Every row's first `prompt_head` prompt tokens are compared at
        once; a match that runs past them is counted on."""
        head = self.config.prompt_head
        mine = np.full(head, -2, np.int32)  # never equal to a padding
        mine[: min(len(s.prompt), head)] = s.prompt[:head]
        same = self.heads == mine
        runs = np.where(same.all(axis=1), head, same.argmin(axis=1))
        best, donor = 0, None
        for slot in np.flatnonzero(runs > 0).tolist():  # slot order: the first wins a tie
            o = self.batch.rows[slot]
            if o is None or o is s or (runs[slot] <= best and runs[slot] < head):
                continue  # it cannot beat `best` (unless its whole head matched: it may go on)
            have = cached_of(o)
            n = min(int(runs[slot]), len(s.prompt) - 1, have)
            if n == head:
                n = common(s, o, have)
            if n > best:
                best, donor = n, o
        return (best, donor) if best >= self.config.min_shared_prefix else (0, None)

    def write_head(self, seq: Sequence) -> None:
        """A row takes its slot: its first prompt tokens go into the slot's head."""
        head = seq.prompt[: self.config.prompt_head]
        self.heads[seq.slot, : len(head)] = head
        self.heads[seq.slot, len(head) :] = -1

    def first_tokens(self, prefill, logits: mx.array):
        """The first tokens of the rows whose prompt this step's chunks complete, and their
        log-probabilities where asked for ((None, None) where no prompt ends here)."""
        done = [i for i, (s, c) in enumerate(prefill) if s.prefilled + len(c) == len(s.prompt)]
        if not done:
            return None, None
        return first_tokens_of([prefill[i][0] for i in done], logits, done, len(prefill))

    def commit(self, prefill, first: list[int] | None, lp=None, states=None) -> None:
        """The step's chunks are in the cache: rows whose prompt ended emit their first
        token and their drafters take them on."""
        b = self.batch
        if states is not None:
            keep_prefill_states(prefill, states)
        firsts = iter(enumerate(first or []))
        now = time.perf_counter()
        for s, chunk in prefill:
            s.prefilled += len(chunk)
            b.cache.lengths[s.slot] += len(chunk)
            if s.prefilled < len(s.prompt):
                continue
            j, t = next(firsts)
            s.metrics.t_first = now
            record = (
                [b.commit.lp_record(lp, j, t)] if lp is not None and s.params.logprobs else None
            )
            reason = b.commit.emit(s, [t], record)
            if reason is not None:
                b.commit.finish(s, reason)
                continue
            b.commit.admit_drafters(s)


def common(s: Sequence, o: Sequence, have: int) -> int:
    """Prompt tokens `s` shares with the first `have` cached tokens of row `o` (never its
    whole prompt: the last token is always computed, for the first token's logits)."""
    p, q = s.prompt, o.prompt
    limit = min(len(p) - 1, len(q), have)
    n = 0
    while n < limit and p[n] == q[n]:
        n += 1
    return n


def first_tokens_of(seqs, logits: mx.array, done: list[int], rows: int):
    """The first generated token of rows whose prompt is now in the cache (and the
    log-probabilities asked for, else None)."""
    picked = logits[mx.array(done)] if len(done) < rows else logits
    pos = np.array([len(s.prompt) for s in seqs])
    seeds = np.array([s.seed for s in seqs], dtype=np.uint32)
    params = [s.params for s in seqs]
    picked = adjust(
        picked,
        [(j, t, d) for j, p in enumerate(params) for t, d in p.adjustments(Counter()).items()],
    )
    masked = [j for j, s in enumerate(seqs) if s.grammar is not None]
    if masked:
        bits = np.concatenate([seqs[j].grammar.masks([0], [-1]) for j in masked])
        picked = apply_masks(picked, masked, bits)
        for j in masked:
            seqs[j].grammar.single = [single(bits[masked.index(j)])]
    tokens = choose(picked, params, seeds, pos)
    lp = None
    if any(p.logprobs for p in params):
        lp = token_logprobs(picked, params, tokens, max(p.top_logprobs for p in params))
    return tokens, lp


def keep_prefill_states(prefill, h: mx.array | None) -> None:
    """The rows whose prompt this prefill step completes keep its last position's state
    (h: one per chunk); call before the step's `prefilled` counts move on."""
    for j, (s, chunk) in enumerate(prefill):
        if s.prefilled + len(chunk) == len(s.prompt):
            s.states.append(Span(h, j, 1))
