"""The engine: a resident target model, its drafters' shared state and this machine's
costs, generating continuous batches (batch.py) with speculative decoding."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace

import mlx.core as mx
from mlx_lm.generate import generation_stream

from core.models import LoadedModel, load_model

from . import drafters as registry
from .batch import Batch
from .config import EngineConfig
from .costs import CostSurface, load_kept, load_or_measure
from .draft_length import PRIORS, WARMUP, AcceptanceStats
from .drafters.base import Drafter
from .drafters.suffix import Corpora
from .learner import Learner, LearnerFactory
from .memory import kv_budget
from .observer import StepObserver
from .results import GenerationResult
from .sampling import GenerationParams
from .scorer import check_supported


def parse_draft_spec(spec: str) -> tuple[str, str | None]:
    """`early-exit:8` -> ("early-exit", "8"). Raises ValueError naming the valid forms."""
    entry, arg = registry.parse(spec)
    return entry.name, arg


def _verify_cost(target: LoadedModel, surface: CostSurface | None, batch_size, limit: int):
    """A verify step's cost by width (tokens per row), in plain steps, at the rows the
    engine will run, from its surface or the one kept for this machine; None (width free)
    when neither is known yet: the surface is measured at the first batch, after the stored
    adapter is chosen."""
    surf = surface or load_kept(target.model, target.weight_format)
    if surf is None:
        return None
    return surf.verify_cost(batch_size or surf.best_batch(limit))


class Engine:
    """A resident target model that generates batches with speculative decoding.

    Args:
        target: the model whose output distribution is reproduced exactly.
        draft: drafter spec (drafters.forms()).
        config: the engine's settings (config.EngineConfig); keywords given beside it
            (`k=2`, `batch_size=8`, ...) replace its fields.
        draft_model: the model for `draft-model:NAME` (loaded by name if omitted); with
            `auto` or `tree` it joins prompt lookup.
        surface: the verify-cost surface; kept under APPLESPEC_HOME, measured once per
            machine and model when missing.
        draft_cost: one draft-model step in units of one plain target step at the same
            batch size; None = from both models' measured surfaces.
        progress: receives a line per stage of a surface being measured.
        learner: with a self-drafter in play (`adapter[:L]`, `auto` with a stored one), builds
            its online learner from (target model, serving adapter) (learner.py; e.g.
            core/training/online.py's `learner_factory(share)`): it trains on the rows this
            engine finishes and swaps in versions that agree more on a held-out slice of
            them. With `adapter:L` and none stored it starts untrained. None = no learning.
        clock: the seconds the step modes time each kind of step by (a test passes a
            clock of its own so that the choice does not depend on the machine).
        observers: receive every batch step's report (observer.StepReport).

    The settings (EngineConfig's fields):
        k: fixed draft length; None = chosen per row and step from measured acceptance.
        batch_size: rows per batch; None = chosen from the surface, at most `max_rows`.
        max_rows: the most rows a batch of this engine will hold (a job's item count):
            the surface is measured only up to the batch sizes that many rows use. None =
            `batch_size`, else the whole grid.
        max_kv_bytes: KV cache budget of a batch; None = `memory.kv_budget()`, a share of
            the device's memory left beside the weights. A request that cannot fit alone
            fails at `submit`; others wait for room.
        prefill_tokens: prompt tokens prefilled per step while other rows decode.
        lane_from: cached positions beyond which a row's keys and values move out of the
            batch's dense block to a lane of their own (cache.py).
        profile: evaluate at phase boundaries so draft/verify/accept/cache times are exact
            (a few extra syncs per step); off, the device time shows up in accept_s.
        overlap: finish the previous step's rows while the device runs the current forward.
        pipeline: plain decoding (`none`) queues each step before reading the previous one
            back (mlx-lm's double buffering); False syncs every step.
        share_prefixes: a joining row copies the keys and values of the longest prompt
            prefix another row of the batch holds instead of computing them.
        step_modes: a batch measures its kinds of step against each other (wall time,
            host work included) and runs the fastest (step_modes.StepModes): host-synced
            drafting steps, the resident loop where the batch can run it and plain steps
            (double-buffered); False drafts on every step the policy pays for. Off with a
            fixed `k`. None = on, except in a batch whose one drafter is the head running
            the loop.
        resident: a batch drafting with the feature head (`head`, or `auto` with a head
            stored) whose rows ask for no penalties, biases or log-probabilities may draft
            a chain of `k` tokens a row in a loop resident on the device (step_loop.py),
            its length chosen from the head's measured acceptance and this machine's
            costs; where no length pays, plain steps run. None = on where a GPU runs the
            model.
        runs_ahead: whether the device runs a queued forward while the host goes on (a
            GPU's; on the CPU queueing a step's graph computes most of it before it
            returns); None = on a GPU.
        batch_limit .. modes: tuning constants (config.py).
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: str = "auto",
        config: EngineConfig | None = None,
        *,
        draft_model: LoadedModel | None = None,
        surface: CostSurface | None = None,
        draft_cost: float | None = None,
        progress: Callable[[str], None] = lambda s: None,
        learner: LearnerFactory | None = None,
        clock: Callable[[], float] = time.perf_counter,
        observers: Iterable[StepObserver] = (),
        **settings,
    ):
        config = replace(config or EngineConfig(), **settings)
        entry, arg = registry.parse(draft)
        check_supported(target.model)
        if entry.name == "early-exit":
            n = target.num_layers
            if not 0 < int(arg) < n:
                raise ValueError(f"early-exit layer must be between 1 and {n - 1}, got {arg}")
        # A stored self-drafter (`adapter`; `auto` when one is stored), loaded once.
        self.adapter = registry.stored_adapter(
            target,
            entry.name,
            arg,
            learner is not None,
            lambda: _verify_cost(target, surface, config.batch_size, config.batch_limit),
        )
        self.learner: Learner | None = None
        if self.adapter is not None and learner is not None:
            self.learner = learner(target.model, self.adapter)
        if entry.name == "draft-model" and draft_model is None:
            draft_model = load_model(arg)
        if draft_model is not None:
            check_supported(draft_model.model)
            if draft_model.vocab_size != target.vocab_size:
                raise ValueError(
                    f"draft model {draft_model.name} has vocabulary {draft_model.vocab_size}, "
                    f"target {target.name} has {target.vocab_size}: they must share a tokenizer"
                )
        on_gpu = mx.default_device() == mx.gpu
        self.config = replace(  # the choices left to this machine, made
            config,
            max_kv_bytes=kv_budget() if config.max_kv_bytes is None else config.max_kv_bytes,
            prefill_tokens=config.prefill_tokens or (2048 if on_gpu else 256),
            step_modes=config.step_modes if config.k is None else False,
            resident=on_gpu if config.resident is None else config.resident,
            runs_ahead=on_gpu if config.runs_ahead is None else config.runs_ahead,
        )
        self.target = target
        self.draft_spec = draft
        self.entry, self.arg = entry, arg
        self.draft_model = draft_model
        self._surface = surface
        self._draft_surface: CostSurface | None = None
        self._draft_cost = draft_cost
        self._batch_size = config.batch_size
        self.progress = progress
        self.clock = clock  # the seconds the step modes measure steps by (tests replace it)
        self.observers = list(observers)  # every batch's step reports go to these
        # Per drafter: acceptance by draft position, carried from request to request.
        self.acceptance: dict[str, AcceptanceStats] = {}
        # Drafters' step timings on this machine, kept across batches: (drafter, capacity)
        # -> rows -> milliseconds (FeatureHeadDrafter.step_cost).
        self.step_ms: dict[tuple[str, int], dict[int, float]] = {}
        # Per job: the suffix index of its finished answers (`suffix` drafting).
        self.corpora = Corpora()

    @classmethod
    def load(cls, model: str, draft: str = "auto", **kw) -> Engine:
        registry.parse(draft)  # fail on a bad spec before loading anything
        return cls(load_model(model), draft=draft, **kw)

    @property
    def surface(self) -> CostSurface:
        if self._surface is None:
            with mx.stream(generation_stream):
                t = self.target
                self._surface = load_or_measure(
                    t.model, t.name, t.weight_format, self.progress, self._rows()
                )
        return self._surface

    def _rows(self) -> int | None:
        """The most rows a batch holds, where known (what the surface must cover)."""
        sizes = [n for n in (self._batch_size, self.config.max_rows) if n]
        return min(sizes) if sizes else None

    @property
    def draft_surface(self) -> CostSurface:
        if self._draft_surface is None:
            d = self.draft_model
            with mx.stream(generation_stream):
                self._draft_surface = load_or_measure(
                    d.model, d.name, d.weight_format, self.progress, self._rows()
                )
        return self._draft_surface

    @property
    def batch_size(self) -> int:
        if self._batch_size is None:
            cfg = self.config
            self._batch_size = self.surface.best_batch(cfg.max_rows or cfg.batch_limit)
        return self._batch_size

    def prepare(self, max_rows: int | None = None) -> float:
        """Do the one-time setup a first batch would otherwise do inside its first step
        (this machine's verify costs measured where none are kept, the batch size chosen);
        the seconds it took. A job timed after it stores no setup in its throughput.
        `max_rows`: the most rows this engine's batches will hold (a job's item count),
        where it was not known at construction."""
        if max_rows is not None:
            self.config = replace(self.config, max_rows=max_rows)
        t0 = time.perf_counter()
        self.batch_size  # noqa: B018 (measures the surface where needed)
        if self.draft_model is not None and self._draft_cost is None:
            self.draft_surface  # noqa: B018
        return time.perf_counter() - t0

    def draft_step_cost(self, rows: int, batch: int) -> float:
        """One draft-model step over `rows` rows, in plain target steps at `batch` rows."""
        if self._draft_cost is not None:
            return self._draft_cost
        return self.draft_surface(rows, rows) / self.surface(batch, batch)

    def carried(self, drafter: Drafter, loop: bool = False) -> AcceptanceStats:
        """The drafter's acceptance by draft position, carried across requests. `loop`: the
        resident loop's, kept apart: the loop verifies the head's whole chain on every row,
        while a host-synced step verifies the rows that chose the head, only the nodes that
        pay (`draft_length.gate`), so each measures its own chance of a second token."""
        key = f"{drafter.name} (loop)" if loop else drafter.name
        if key not in self.acceptance:
            measured = drafter.prior
            stats = AcceptanceStats(measured or PRIORS.get(drafter.kind, PRIORS["ngram"]))
            if measured:  # measured offline, not guessed: rows start from it, no warm-up
                stats.updates = WARMUP
            self.acceptance[key] = stats
        return self.acceptance[key]

    def new_batch(self, capacity: int | None = None) -> Batch:
        return Batch(self, capacity or self.batch_size)

    # -- convenience ------------------------------------------------------------------

    def generate(self, prompt: list[int], params: GenerationParams) -> GenerationResult:
        """One request alone (a batch of one)."""
        return self.generate_many([(prompt, params)], capacity=1)[0]

    def chat(self, messages: list[dict], params: GenerationParams) -> GenerationResult:
        return self.generate(self.target.encode_chat(messages), params)

    def generate_many(
        self,
        requests: Iterable[tuple[list[int], GenerationParams]],
        capacity: int | None = None,
        on_result: Callable[[GenerationResult], None] | None = None,
    ) -> list[GenerationResult]:
        """Every request through one continuous batch; results in request order. The
        requests are one job: later ones draft from earlier answers (`suffix`)."""
        batch = self.new_batch(capacity)
        job = object()
        seqs = [
            batch.submit(p, params, tag=i, corpus=job) for i, (p, params) in enumerate(requests)
        ]
        out: list[GenerationResult | None] = [None] * len(seqs)
        try:
            for r in batch.run():
                out[r.tag] = r
                if on_result is not None:
                    on_result(r)
        finally:
            self.corpora.drop(job)
        return out  # type: ignore[return-value]
