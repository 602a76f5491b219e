"""The resident loop's steps: while every row decodes with the feature head and needs no
host work, each step is queued before the previous one is read (resident.py holds the loop's
device state), with a chain length chosen from the head's measured acceptance and this
machine's costs."""

from __future__ import annotations

from collections import Counter

import numpy as np

from .draft_length import K_MAX, chain_speedups
from .drafters.feature_head import FeatureHeadDrafter
from .resident import Launched, ResidentLoop
from .results import GenerationResult
from .states import Span


class LoopSteps:
    """A batch's resident-loop steps, with `head` (its width-1 feature head) drafting.
    `chains` counts the loop's steps by chain length, `probes` lists the probes run."""

    def __init__(self, batch, head: FeatureHeadDrafter):
        self.batch = batch
        self.head = head
        self.loop: ResidentLoop | None = None  # the loop, while rows run it
        self.chain: tuple[int, int] | None = None  # the chain length chosen, and its step
        self.probe = (0, batch.config.loop_probe)  # the step a chain last ran from, the wait
        self.chains: Counter[int] = Counter()
        self.probes: list[tuple[int, int]] = []  # each probe's step, and the next one's wait

    def ok(self) -> bool:
        """Whether this step can run in the resident loop (Engine's `resident`)."""
        b = self.batch
        if b.cache.lanes:
            return False  # (the loop's forwards read every row from the dense block)
        rows = [s for s in b.rows if s is not None]
        if not rows or b.admission.admissible():
            return False
        return all(s.decoding and not s.params.needs_host for s in rows)

    def k(self) -> int:
        """The resident loop's chain length: the engine's `k` where set, else the one whose
        expected tokens per unit of time are the most (`draft_length.chain_speedups`) from
        the head's acceptance by draft position in the loop (`Engine.carried(head,
        loop=True)`: carried across the engine's requests and measured by the loop as it
        runs) and this machine's costs at the rows the loop runs: the verify surface's width
        cost and the head's depths, timed. 0 where no chain beats plain steps. Chosen again
        every `loop_choose_every` steps; a chosen length changes (leaving the loop and
        entering it again: one step's sync) only for a predicted gain of `loop_switch` or
        more, so near-ties do not make it flap.

        Where no chain pays, the loop's acceptance is no longer measured (plain steps
        draft nothing), so a job whose first rows the head drafted badly for would never
        draft again: after `loop_probe` steps without a chain, the best length runs for one
        choice's steps all the same, and the wait doubles (to `loop_probe_max`) each time
        the probe leaves it not paying (docs/decisions.md)."""
        b, cfg = self.batch, self.batch.config
        if cfg.k:
            return cfg.k
        if self.chain is not None and b.steps - self.chain[1] < cfg.loop_choose_every:
            return self.chain[0]
        speedups = self.speedups()
        k = int(np.argmax(speedups))
        since, wait = self.probe
        if k == 0 and b.steps - since >= wait:  # a probe
            k = 1 + int(np.argmax(speedups[1:]))
            self.probe = (b.steps, min(2 * wait, cfg.loop_probe_max))
            self.probes.append(self.probe)
        elif self.chain is not None and speedups[k] < cfg.loop_switch * speedups[self.chain[0]]:
            k = self.chain[0]
        if k and speedups[k] > 1.0:  # a chain that pays: the next probe waits from scratch
            self.probe = (b.steps, cfg.loop_probe)
        self.chain = (k, b.steps)
        return k

    def rows(self) -> int:
        """The rows a loop step computes: every slot on CUDA, else the live rows."""
        b = self.batch
        if b.cache.pad > 1:
            return b.capacity
        return max(sum(s is not None and s.finish_reason is None for s in b.rows), 1)

    def speedups(self) -> np.ndarray:
        """The resident loop's predicted speedup over plain steps by chain length, 0 ..
        `K_MAX` (`draft_length.chain_speedups`), at the rows it runs now."""
        b = self.batch
        head = self.head
        rows = self.rows()
        draft, verify = head.step_cost(rows), b.engine.surface.verify_cost(rows)
        return chain_speedups(b.engine.carried(head, loop=True).gains(K_MAX), draft, verify)

    def run(self) -> list[GenerationResult]:
        """A step of the resident loop: the next one queued, then the one before it read
        and committed while this one runs."""
        b = self.batch
        if self.loop is None:  # entering: the head drafts the first tokens as usual
            b.plain.read_lag()
            decode = [s for s in b.rows if s is not None and s.decoding]
            if not decode:
                return b.commit.results()
            head = self.head
            k = self.k()
            draft = head.propose(decode, [k] * len(decode))
            self.loop = ResidentLoop(b, head, decode, draft.tokens[:, :k])
        prev = self.loop.launch()
        if self.loop.in_flight is not None:
            self.chains[self.loop.k] += 1
        results = b.commit.results()
        if prev is not None:
            self.commit(prev)  # the step's one sync
        b.steps += 1
        return results

    def commit(self, step: Launched, last: bool = False) -> None:
        """Emit a loop step's tokens: each row's pending token's successor, and the one
        after each draft of the chain's accepted prefix. The states of the positions it
        committed are the pairs the head read in the loop (kept when it learns); `last`
        (the loop ends) hands the head each row's last one to read again, as after a
        verify step."""
        b = self.batch
        picks, accepted = step.picks.tolist(), step.accepted.tolist()
        head, w = self.head, step.picks.shape[1]
        chains = b.engine.carried(head, loop=True)
        B = sum(s is not None for s in step.rows)
        finished = []
        for j, s in enumerate(step.rows):
            if s is None or s.finish_reason is not None:
                continue  # not advanced, or finished meanwhile: computed for nothing
            a = accepted[j]
            for d in b.drafters:  # no host-synced drafting this step
                s.stats[d.name].observe(0, a)
            chains.observe(w - 1, a)
            b.report.drafted += w - 1
            b.report.accepted += a
            s.metrics.record_step(head.name, w - 1, a, 1 + a)
            s.batch_rows += B
            b.cache.lengths[s.slot] += 1 + a
            head.cache.lengths[s.slot] += 1 + a
            had = len(s.output)
            reason = b.commit.emit(s, picks[j][: 1 + a], None)
            n = len(s.output) - had  # fewer than 1 + a where the row ended in this step
            read = [Span(step.states, w * j, n)] if n else []
            if last and reason is None:
                read = [Span(step.states, w * j, a)] if a else []
                s.states = [Span(step.states, w * j + a, 1)]
                head.cache.lengths[s.slot] -= 1
            if head.keep:  # the states of the tokens emitted, as many as they
                head.keep_read(s, read)
            if reason is not None:
                finished.append((s, reason))
        for s, reason in finished:
            b.commit.finish(s, reason)

    def leave(self) -> None:
        """Read and commit the loop's step in flight; the head reads on as after a verify."""
        b = self.batch
        step = self.loop.drain()
        self.loop = None
        if step is not None:
            with b.draining("loop"):
                self.commit(step, last=True)
