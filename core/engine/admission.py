"""Requests into rows: a request's checks and rows (`n` answers each), the queue, which
requests join free rows within the batch's KV budget, and cancelling."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from .grammar import compile_format
from .memory import RequestTooLarge, bytes_per_position, kv_bytes, row_positions
from .metrics import RequestMetrics
from .results import Group
from .sampling import GenerationParams, row_seed
from .sequence import Sequence


class Admission:
    """A batch's queue and the rules by which queued requests take its free rows."""

    def __init__(self, batch):
        self.batch = batch
        self.queue: deque[Sequence] = deque()
        self.per_position = bytes_per_position(batch.target.model)

    def submit(
        self,
        prompt: list[int],
        params: GenerationParams,
        tag: Any = None,
        isolate: bool = False,
        on_admit: Callable[[], None] | None = None,
        corpus: Any = None,
    ) -> Sequence:
        """Queue a request (Batch.submit); its first row."""
        b = self.batch
        target, budget = b.target, b.config.max_kv_bytes
        ctx = target.context_length
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= ctx:
            raise ValueError(f"prompt has {len(prompt)} tokens; the model's context is {ctx}")
        alone = kv_bytes(
            [row_positions(len(prompt), params.max_tokens, ctx)],
            b.cache.lane_from,
            self.per_position,
        )
        if alone > budget:
            raise RequestTooLarge(
                f"this request needs {alone / 2**30:.2f} GiB of KV cache ({len(prompt)} prompt "
                f"tokens + up to {params.max_tokens} generated); this worker's budget is "
                f"{budget / 2**30:.2f} GiB: shorten the prompt or max_tokens"
            )
        group = Group(params.n) if params.n > 1 else None
        base = row_seed(params)
        grammar = None
        if params.response_format is not None:  # raises GrammarError (a ValueError)
            grammar = compile_format(params.response_format, target.tokenizer, target.vocab_size)
        for i in range(params.n):
            seed = base if i == 0 else (base + i if params.seed is not None else row_seed(params))
            seq = Sequence(
                prompt=list(prompt),
                params=params,
                max_tokens=min(params.max_tokens, ctx - len(prompt)),
                seed=seed & 0xFFFFFFFF,
                tag=tag,
                corpus=corpus,
                metrics=RequestMetrics(drafter=b.engine.draft_spec),
                group=group,
                isolate=isolate,
                on_admit=on_admit if i == 0 else None,
                grammar=grammar.row() if grammar is not None else None,
            )
            self.queue.append(seq)
            if group is not None:
                group.seqs.append(seq)
        return group.seqs[0] if group is not None else seq

    def admissible(self) -> bool:
        """Whether `admit` would take a queued request now."""
        rows = self.batch.rows
        if not self.queue or all(r is not None for r in rows):
            return False
        if any(r is not None and r.isolate for r in rows):
            return False
        if self.queue[0].isolate and self.batch.active:
            return False
        return self.fits(self.queue[0])

    def admit(self) -> None:
        """Queued requests take free rows, in order, while they fit; a request to run alone
        waits for the rows in flight and lets none join it."""
        b = self.batch
        free = [i for i, r in enumerate(b.rows) if r is None]
        alone = any(r is not None and r.isolate for r in b.rows)
        while free and self.queue and not alone and self.fits(self.queue[0]):
            if self.queue[0].isolate and b.active:
                break  # it waits for the rows in flight to finish
            seq = self.queue.popleft()
            alone = seq.isolate
            seq.slot = free.pop(0)
            seq.t_admit = time.perf_counter()
            seq.metrics.t_start = seq.t_admit
            b.rows[seq.slot] = seq
            b.prefill.write_head(seq)
            b.cache.release(seq.slot)
            if seq.on_admit is not None:
                seq.on_admit()

    def fits(self, seq: Sequence) -> bool:
        """Whether the rows' KV cache, with `seq` joining them, stays in the budget (a row
        alone always runs: `submit` refused those that cannot)."""
        b = self.batch
        if b.active == 0:
            return True
        need = [row_positions(len(s.prompt), s.max_tokens) for s in b.rows if s is not None]
        need.append(row_positions(len(seq.prompt), seq.max_tokens))
        return kv_bytes(need, b.cache.lane_from, self.per_position) <= b.config.max_kv_bytes

    def take_queued(self, which: Callable[[Sequence], bool] | None = None) -> list[Sequence]:
        """Remove and return the requests not admitted yet (those `which` picks)."""
        out = [s for s in self.queue if which is None or which(s)]
        taken = {s.uid for s in out}
        self.queue = deque(s for s in self.queue if s.uid not in taken)
        return out

    def drop(self, which: Callable[[Sequence], bool]) -> list[Sequence]:
        """Stop the rows and queued requests `which` picks (their job was cancelled)."""
        b = self.batch
        out = self.take_queued(which)
        for s in b.rows:
            if s is not None and which(s):
                for d in b.drafters:
                    d.retire(s)
                b.rows[s.slot] = None
                b.cache.release(s.slot)
                s.finish_reason = "cancelled"
                out.append(s)
        # (a plain-decoding step still in flight skips them: their finish_reason is set)
        return out
