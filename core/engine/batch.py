"""One continuous batch: requests join free rows from a queue, decode, and leave as they
finish. Each `step()` picks a kind of step and runs it:

- host-synced (step_synced.py): admit, prefill chunks, draft, one target forward over
  every row's nodes and the chunks, one sync, commit;
- plain (step_plain.py): one token a row, double-buffered as mlx-lm's;
- the resident loop (step_loop.py): the feature head's chains, each step queued before the
  previous one is read.

The step modes (step_modes.py) time the kinds against each other on the batch's own steps
and run the fastest. Around the runners: admission.py (queue, KV budget, cancelling),
prefill.py (prompt chunks, shared prefixes), proposal.py (drafter and length per row),
packing.py (drafts into verify segments), commit.py (acceptance, emission, finishing).

Greedy rows reproduce plain greedy decoding and sampled rows plain seeded sampling, token
for token, whatever the drafter and whichever rows share the batch (up to floating-point
rounding, which depends on how many rows share a matmul; see the bench's gap check).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.generate import generation_stream

from .admission import Admission
from .cache import BatchKVCache
from .commit import Commit
from .draft_length import token_cost
from .drafters.base import DraftContext, Drafter
from .drafters.feature_head import FeatureHeadDrafter
from .observer import StepObserver, StepReport
from .prefill import Prefill
from .proposal import Proposal
from .results import GenerationResult
from .sampling import GenerationParams
from .sequence import Sequence
from .step_loop import LoopSteps
from .step_modes import StepModes
from .step_plain import PlainSteps
from .step_synced import SyncedSteps


class Batch:
    """Up to `capacity` rows of `engine`'s requests in one KV cache with per-row lengths.
    `observers` (the engine's, and any added) receive each step's `StepReport`."""

    def __init__(self, engine, capacity: int):
        self.engine = engine
        self.config = engine.config
        self.target = engine.target
        self.capacity = capacity
        self.cache = BatchKVCache(
            engine.target.num_layers, capacity, lane_from=self.config.lane_from
        )
        self.rows: list[Sequence | None] = [None] * capacity
        self.steps = 0
        self.emitted = 0  # tokens emitted by this batch's rows
        self.observers: list[StepObserver] = list(engine.observers)
        self.report = StepReport()  # the step running, as it is measured
        self.admission = Admission(self)
        self.prefill = Prefill(self)
        self.proposal = Proposal(self)
        self.commit = Commit(self)
        self.synced = SyncedSteps(self)
        self.plain = PlainSteps(self)
        self._build_drafters()
        head = self.loop.head if self.loop is not None else None
        alone = head is not None and len(self.drafters) == 1  # the loop is its drafting
        if alone:
            kinds = ("loop", "plain")
        elif head is not None:
            kinds = ("draft", "loop", "plain")
        else:
            kinds = ("draft", "plain")
        modes = self.config.step_modes
        if modes is None:  # the default: on, unless this batch's drafting is the loop alone
            modes = not alone
        self.modes = None
        if self.drafters and modes:
            self.modes = StepModes(kinds, self._draft_price, self.config.modes)
        self._kind = kinds[0]  # the kind of step that runs without step modes
        self.mode = self._kind  # the kind of the step that ran last (StepModes' kinds)

    def _build_drafters(self) -> None:
        """The engine's drafters for this batch, and the resident loop where its feature
        head drafts chains and the engine runs the loop."""
        e = self.engine
        self._draft_model_drafter = None
        ctx = DraftContext(
            target=self.target,
            cache=self.cache,
            capacity=self.capacity,
            adapter=e.adapter,
            draft_model=self.draft_model_drafter if e.draft_model is not None else None,
            plain_ms=lambda rows: e.surface(rows, rows),
            head_timings=e.step_ms.setdefault(("head", self.capacity), {}),
            learns=e.learner is not None,
            corpora=e.corpora,
        )
        self.drafters: list[Drafter] = e.entry.build(ctx, e.arg)
        self.reads_states = any(getattr(d, "reads_states", False) for d in self.drafters)
        heads = [d for d in self.drafters if isinstance(d, FeatureHeadDrafter) and d.width == 1]
        self.loop = LoopSteps(self, heads[0]) if self.config.resident and heads else None

    def draft_model_drafter(self):
        """This batch's draft-model drafter (one cache row per slot), built once."""
        if self._draft_model_drafter is None:
            from .drafters.draft_model import DraftModelDrafter

            e = self.engine
            self._draft_model_drafter = DraftModelDrafter(
                e.draft_model, self.capacity, lambda rows: e.draft_step_cost(rows, self.active)
            )
        return self._draft_model_drafter

    # -- requests ---------------------------------------------------------------------

    def submit(
        self,
        prompt: list[int],
        params: GenerationParams,
        tag: Any = None,
        isolate: bool = False,
        on_admit: Callable[[], None] | None = None,
        corpus: Any = None,
    ) -> Sequence:
        """Queue a request; it joins the batch when a row is free.

        `corpus` names its job: rows of one job share the job's suffix index (`suffix`
        drafting), each adding its answer when it finishes.

        `isolate` runs it alone (nothing else admitted while it runs; it waits for the
        batch to empty): a request that was in flight when a worker died may be the one
        that killed it. `on_admit` is called when its row joins. Raises ValueError for a
        prompt that cannot run, `RequestTooLarge` past the KV budget alone.
        """
        return self.admission.submit(prompt, params, tag, isolate, on_admit, corpus)

    @property
    def queue(self):
        return self.admission.queue

    def take_queued(self, which: Callable[[Sequence], bool] | None = None) -> list[Sequence]:
        """Remove and return the requests not admitted yet (those `which` picks)."""
        return self.admission.take_queued(which)

    def drop(self, which: Callable[[Sequence], bool]) -> list[Sequence]:
        """Stop the rows and queued requests `which` picks (their job was cancelled)."""
        return self.admission.drop(which)

    def abandon(self) -> list[Any]:
        """Drop every row and queued request (after an engine failure); their tags."""
        tags = [s.tag for s in self.rows if s is not None] + [s.tag for s in self.queue]
        tags += [s.tag for s in self.commit.done]
        for s in self.rows:  # drafters let go of the rows' state (a suffix row's live region)
            if s is not None:
                for d in self.drafters:
                    d.retire(s)
        self.rows = [None] * self.capacity
        self.queue.clear()
        self.commit.done = []
        self.plain.lag = None
        self.cache = BatchKVCache(
            self.target.num_layers, self.capacity, lane_from=self.config.lane_from
        )
        self._build_drafters()
        return tags

    @property
    def active(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def idle(self) -> bool:
        return (
            not self.queue
            and self.active == 0
            and not self.commit.done
            and not self.plain.lag
            and (self.loop is None or self.loop.loop is None)
        )

    def run(self) -> Iterator[GenerationResult]:
        """Step until every queued request has finished, yielding results as they do."""
        while not self.idle:
            yield from self.step()

    # -- one step ---------------------------------------------------------------------

    def step(self) -> list[GenerationResult]:
        """One step of the kind the step modes run; the results of rows that finished.
        Then the observers get its report, and the self-drafter's online learning a turn."""
        with mx.stream(generation_stream):
            clock = self.engine.clock
            decoding = any(s is not None and s.decoding for s in self.rows)
            report = self.report = StepReport(decoding=decoding)
            t0, n0 = clock(), self.emitted
            out = self._run()
            report.seconds, report.tokens = clock() - t0, self.emitted - n0
            for _, n, sec in report.drained:
                report.tokens, report.seconds = report.tokens - n, report.seconds - sec
            report.rows = self.active
            self._time_modes(report)
            for observe in self.observers:
                observe(report)
            if self.engine.learner is not None:
                self.engine.learner.tick()
            return out

    def _run(self) -> list[GenerationResult]:
        kind = self.mode = self._kind if self.modes is None else self.modes.mode
        report = self.report
        report.kind = kind
        plain = not self.drafters or kind == "plain"
        loop = self.loop
        # The loop where its rows can run it, else a host-synced drafting step.
        resident = kind == "loop" and loop is not None and loop.ok()
        if resident and loop.k() == 0:  # no chain pays at these rows: plain steps
            resident, plain = False, True
        if loop is not None and loop.loop is not None and (not resident or loop.loop.k != loop.k()):
            loop.leave()
        # A double-buffered step with none of its own kind in flight to read: its entry.
        if plain and self.config.pipeline and not self._needs_sync():
            report.runner, report.entry = "plain", self.plain.lag is None
            return self._timed("plain", self.plain.run)
        if resident:
            report.runner, report.entry = "loop", loop.loop is None
            return self._timed("loop", loop.run)
        return self.synced.run(self._host_drafters())

    def _timed(self, phase: str, run: Callable[[], list[GenerationResult]]):
        t0 = time.perf_counter()
        out = run()
        self.report.phases[phase] = time.perf_counter() - t0
        return out

    def _time_modes(self, report: StepReport) -> None:
        """The step modes measure the step: work it read from an earlier step of another
        kind goes to that kind; a step that only prefilled (rows joining a batch none of
        whose rows was decoding) is the prompts' time whatever kind is current and measures
        none. Where the device runs ahead, a double-buffered kind's entry is the host's
        launch alone and measures nothing in a trial (StepModes.observe); on the CPU it
        holds its forward and counts."""
        if self.modes is None:
            return
        for kind, n, sec in report.drained:
            self.modes.credit(kind, n, sec)
        if report.decoding:
            evidence = sum(d.evidence() for d in self.drafters)
            entry = report.entry and self.config.runs_ahead
            self.modes.observe(
                report.kind, report.tokens, report.seconds, report.rows, evidence, entry
            )

    @contextmanager
    def draining(self, kind: str) -> Iterator[None]:
        """A step of `kind` computed what this reads: the tokens and the wait are its."""
        t0, n0 = self.engine.clock(), self.emitted
        yield
        self.report.drained.append((kind, self.emitted - n0, self.engine.clock() - t0))

    def _needs_sync(self) -> bool:
        """Rows whose next token needs the host first (penalties count the last token) or
        whose log-probabilities are read: plain decoding then syncs every step."""
        live = [r for r in self.rows if r is not None] + list(self.queue)
        return any(r.params.needs_host for r in live)

    def _draft_price(self, rows: int) -> float:
        """What a draft token a row costs to verify at `rows` rows (`token_cost`): what the
        step modes watch as the rows change."""
        return token_cost(self.engine.surface, rows, 2 * rows)

    def _host_drafters(self) -> list[Drafter]:
        """The drafters a host-synced step's rows choose among, by the step's kind, so that
        each kind's measured rate is that of its own drafters:
        - `plain`: none. A plain step syncs where a row's next token needs the host (a row
          asking for log-probabilities or penalties); it verifies one token a row all the
          same, as a double-buffered one does.
        - where the head's loop is a kind of its own beside host-synced drafting, `draft`
          drafts with the others (a host-synced step whose rows choose the head waits for
          its sequential depths), and the loop's kind with the head alone where the loop
          cannot run (rows joining, a row asking for log-probabilities).
        - the loop's kind (also the head's alone, without step modes) in a step where the
          loop cannot run only because rows are joining (admitted, prefilling): the head,
          host-synced (docs/decisions.md)."""
        if self.modes is None and self.mode != "loop":
            return self.drafters
        if self.mode == "plain":
            return []
        if self.loop is None:
            return self.drafters
        head = self.loop.head
        if self.mode == "loop":
            return [head]
        return [d for d in self.drafters if d is not head]
