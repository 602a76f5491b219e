"""The engine: continuous batches of requests, speculating per row.

A `Batch` holds up to `capacity` rows in one KV cache with per-row lengths. Each `step()`:

1. admits queued requests into free rows (within the KV budget);
2. drafts for the decoding rows: lookups offer their tokens, the policy (draft_length.py)
   picks each row's draft length from its measured acceptance and the machine's cost
   surface at this batch size, model drafters then draft exactly that many;
3. runs one target forward over every decoding row ([pending token, draft nodes...]) and
   the next chunk of the joining rows' prompts (scorer.py);
4. computes the target's own token after every node on the device (sampling.choose) and
   syncs once; while the device works, the host finishes the rows of the previous step;
5. keeps, per row, the draft nodes that equal the target's tokens plus the next token
   (acceptance.py), lowers each row's cache length past what it rejected (a tree keeps its
   accepted path by a gather) and retires rows that hit EOS or max_tokens.

Greedy rows reproduce plain greedy decoding and sampled rows plain seeded sampling, token
for token, whatever the drafter and whichever rows share the batch (up to floating-point
rounding, which depends on how many rows share a matmul; see the bench's gap check).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream

from core.models import LoadedModel, load_model

from . import drafters as registry
from .acceptance import walk
from .cache import LANE_FROM, BatchKVCache
from .costs import CostSurface, load_kept, load_or_measure
from .draft_length import (
    GATE_COST,
    K_INIT,
    K_MAX,
    PRIORS,
    WARMUP,
    AcceptanceStats,
    Offer,
    RowPolicy,
    StepModes,
    allocate,
    chain_speedups,
    gate,
    token_cost,
)
from .drafters.base import Draft, Drafter
from .drafters.feature_head import FeatureHeadDrafter
from .drafters.suffix import Corpora
from .grammar import apply_masks, compile_format, segment_masks
from .learner import Learner, LearnerFactory
from .memory import (
    RequestTooLarge,
    bytes_per_position,
    kv_budget,
    kv_bytes,
    row_positions,
)
from .metrics import RequestMetrics
from .resident import Launched, ResidentLoop
from .sampling import GenerationParams, adjust, choose, row_seed, token_logprobs
from .scorer import Segment, check_supported, forward, merge_widths
from .sequence import Sequence
from .states import Span, gather

GREEDY = GenerationParams()
DEFAULT_BATCH_LIMIT = 256  # rows at most when the batch size is chosen from the surface
MIN_SHARED_PREFIX = 8  # shorter common prompt prefixes are computed, not copied
PROMPT_HEAD = 256  # prompt tokens of every row compared at once to find a shared prefix
LOOP_CHOOSE_EVERY = 16  # steps between choices of the resident loop's chain length
LOOP_SWITCH = 1.03  # the predicted gain that changes it
LOOP_PROBE = 64  # steps of plain decoding, where no chain paid, before the loop runs again
LOOP_PROBE_MAX = 1024  # (doubling each time it still does not pay)


@dataclass
class Choice:
    """One answer: its tokens (EOS and a stop sequence excluded), text, why it ended, and
    per token (when asked) {"token", "id", "logprob", "top_logprobs": [...]}."""

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    logprobs: list[dict] | None = None


@dataclass
class GenerationResult:
    tokens: list[int]  # the first answer's generated ids, EOS excluded
    text: str
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    speculative: dict
    timing: dict
    tag: Any = None
    choices: list[Choice] = field(default_factory=list)  # all `n` answers


def parse_draft_spec(spec: str) -> tuple[str, str | None]:
    """`early-exit:8` -> ("early-exit", "8"). Raises ValueError naming the valid forms."""
    entry, arg = registry.parse(spec)
    return entry.name, arg


def _verify_cost(target: LoadedModel, surface: CostSurface | None, batch_size: int | None):
    """A verify step's cost by width (tokens per row), in plain steps, at the rows the
    engine will run, from its surface or the one kept for this machine; None (width free)
    when neither is known yet: the surface is measured at the first batch, after the stored
    adapter is chosen."""
    surf = surface or load_kept(target.model, target.weight_format)
    if surf is None:
        return None
    return surf.verify_cost(batch_size or surf.best_batch(DEFAULT_BATCH_LIMIT))


class Engine:
    """A resident target model that generates batches with speculative decoding.

    Args:
        target: the model whose output distribution is reproduced exactly.
        draft: drafter spec (drafters.forms()).
        k: fixed draft length; None = chosen per row and step from measured acceptance.
        draft_model: the model for `draft-model:NAME` (loaded by name if omitted); with
            `auto` or `tree` it joins prompt lookup.
        surface: the verify-cost surface; kept under APPLESPEC_HOME, measured once per
            machine and model when missing.
        draft_cost: one draft-model step in units of one plain target step at the same
            batch size; None = from both models' measured surfaces.
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
            host work included) and runs the fastest (draft_length.StepModes): host-synced
            drafting steps, the resident loop where the batch can run it (`resident`, with
            the feature head among its drafters: host-synced steps then draft with the
            others, `Batch._host_drafters`) and plain steps (double-buffered); False
            drafts on every step the policy pays for. Off with a fixed `k`. None = on,
            except in a batch whose one drafter is the head running the loop: there the
            trials chose plain steps that lost (at 49 rows on an H100 the loop ran 1.23x
            plain alone, 1.02x under the step modes).
        learner: with a self-drafter in play (`adapter[:L]`, `auto` with a stored one), builds
            its online learner from (target model, serving adapter) (learner.py; e.g.
            core/training/online.py's `learner_factory(share)`): it trains on the rows this
            engine finishes and swaps in versions that agree more on a held-out slice of
            them. With `adapter:L` and none stored it starts untrained. None = no online
            learning.
        clock: the seconds the step modes time each kind of step by (wall time; a test
            passes a clock of its own so that the choice does not depend on the machine).
        runs_ahead: whether the device runs a queued forward while the host goes on (a
            GPU's; on the CPU queueing a step's graph computes most of it before it
            returns); None = on a GPU.
        resident: a batch drafting with the feature head (`head`, or `auto` with a head
            stored) whose rows ask for no penalties, biases or log-probabilities may draft
            a chain of `k` tokens a row in a loop resident on the device (resident.py):
            each step is queued before the previous one is read, as plain decoding's are.
            Unless `k` is set, the chain's length is chosen from the head's measured
            acceptance by position and this machine's costs, again as they change
            (`Batch._loop_k`); where no length pays, plain steps run. The head alone runs
            the loop on every step it can (unless `step_modes` is True: then they weigh it
            against plain steps); under `auto` the step modes weigh it against host-synced
            drafting, whose rows choose among every drafter, and plain steps. None = on where
            a GPU runs the model (there the loop's overlap paid: at 49 rows on an H100
            1.20-1.23x plain against the host-synced steps' 0.74x; on this CPU, where the
            device does not run ahead of the host, the two tie).
    """

    def __init__(
        self,
        target: LoadedModel,
        draft: str = "auto",
        k: int | None = None,
        draft_model: LoadedModel | None = None,
        surface: CostSurface | None = None,
        draft_cost: float | None = None,
        batch_size: int | None = None,
        max_rows: int | None = None,
        max_kv_bytes: int | None = None,
        prefill_tokens: int | None = None,
        lane_from: int = LANE_FROM,
        profile: bool = False,
        overlap: bool = True,
        pipeline: bool = True,
        share_prefixes: bool = True,
        step_modes: bool | None = None,
        progress: Callable[[str], None] = lambda s: None,
        learner: LearnerFactory | None = None,
        resident: bool | None = None,
        clock: Callable[[], float] = time.perf_counter,
        runs_ahead: bool | None = None,
    ):
        entry, arg = registry.parse(draft)
        if k is not None and k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {batch_size}")
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
            lambda: _verify_cost(target, surface, batch_size),
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
        self.target = target
        self.draft_spec = draft
        self.entry, self.arg = entry, arg
        self.k = k
        self.draft_model = draft_model
        self._surface = surface
        self._draft_surface: CostSurface | None = None
        self._draft_cost = draft_cost
        self._batch_size = batch_size
        self.max_rows = max_rows
        self.max_kv_bytes = kv_budget() if max_kv_bytes is None else max_kv_bytes
        self.lane_from = lane_from
        on_gpu = mx.default_device() == mx.gpu
        self.prefill_tokens = prefill_tokens or (2048 if on_gpu else 256)
        self.profile = profile
        self.overlap = overlap
        self.pipeline = pipeline
        self.share_prefixes = share_prefixes
        self.step_modes = step_modes if k is None else False
        self.resident = on_gpu if resident is None else resident
        # The device runs a queued forward while the host goes on (a GPU's); on the CPU
        # queueing a step's graph computes most of it before it returns.
        self.runs_ahead = on_gpu if runs_ahead is None else runs_ahead
        self.progress = progress
        self.clock = clock  # the seconds the step modes measure steps by (tests replace it)
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
        sizes = [n for n in (self._batch_size, self.max_rows) if n]
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
            self._batch_size = self.surface.best_batch(self.max_rows or DEFAULT_BATCH_LIMIT)
        return self._batch_size

    def prepare(self) -> float:
        """Do the one-time setup a first batch would otherwise do inside its first step
        (this machine's verify costs measured where none are kept, the batch size chosen);
        the seconds it took. A job timed after it stores no setup in its throughput."""
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


class Batch:
    """One continuous batch: rows join from a queue, decode, and leave as they finish."""

    def __init__(self, engine: Engine, capacity: int):
        self.engine = engine
        self.target = engine.target
        self.draft_model = engine.draft_model
        self.capacity = capacity
        self._per_position = bytes_per_position(engine.target.model)
        self.cache = BatchKVCache(engine.target.num_layers, capacity, lane_from=engine.lane_from)
        self.rows: list[Sequence | None] = [None] * capacity
        self.queue: deque[Sequence] = deque()
        self._draft_model_drafter = None
        self.drafters: list[Drafter] = engine.entry.build(self, engine.arg)
        self._states = any(getattr(d, "reads_states", False) for d in self.drafters)
        self._done: list[Sequence] = []  # finished last step, results not yet built
        self._lag: tuple[list[Sequence], mx.array] | None = None  # plain decoding's last step
        self._loop: ResidentLoop | None = None  # the resident loop, while rows run it
        self._chain: tuple[int, int] | None = None  # the loop's chain length, when chosen
        self._probe = (0, LOOP_PROBE)  # the step a chain last ran from, steps until a probe
        self.loop_steps: Counter[int] = Counter()  # the loop's steps by chain length
        # per slot, its row's first prompt tokens (-1 beyond them): `_shared` compares them
        self._heads = np.full((capacity, PROMPT_HEAD), -1, np.int32)
        self.steps = 0
        self.emitted = 0  # tokens emitted by this batch's rows
        self._loop_head = self._choose_loop_head()
        alone = self._loop_head is not None and len(self.drafters) == 1  # the loop is its drafting
        if alone:
            kinds = ("loop", "plain")
        elif self._loop_head is not None:
            kinds = ("draft", "loop", "plain")
        else:
            kinds = ("draft", "plain")
        modes = engine.step_modes
        if modes is None:  # the default: on, unless this batch's drafting is the loop alone
            modes = not alone
        self.modes = StepModes(kinds, self._draft_price) if self.drafters and modes else None
        self._kind = kinds[0]  # the kind of step that runs without step modes
        self._mode = self._kind  # the kind of the step that ran last (StepModes' kinds)
        # Work a step read that an earlier step of another kind computed: (kind, tokens,
        # seconds), credited to that kind (StepModes.credit).
        self._drained: list[tuple[str, int, float]] = []
        self._entry = False  # the last step was a double-buffered kind's entry

    def draft_model_drafter(self):
        """This batch's draft-model drafter (one cache row per slot), built once."""
        if self._draft_model_drafter is None:
            from .drafters.draft_model import DraftModelDrafter

            e = self.engine
            self._draft_model_drafter = DraftModelDrafter(
                e.draft_model, self.capacity, lambda rows: e.draft_step_cost(rows, self.active)
            )
        return self._draft_model_drafter

    # -- queue ------------------------------------------------------------------------

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
        that killed it. `on_admit` is called when its row joins.
        """
        ctx = self.target.context_length
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= ctx:
            raise ValueError(f"prompt has {len(prompt)} tokens; the model's context is {ctx}")
        alone = kv_bytes(
            [row_positions(len(prompt), params.max_tokens, ctx)],
            self.cache.lane_from,
            self._per_position,
        )
        if alone > self.engine.max_kv_bytes:
            raise RequestTooLarge(
                f"this request needs {alone / 2**30:.2f} GiB of KV cache ({len(prompt)} prompt "
                f"tokens + up to {params.max_tokens} generated); this worker's budget is "
                f"{self.engine.max_kv_bytes / 2**30:.2f} GiB: shorten the prompt or max_tokens"
            )
        group = _Group(params.n) if params.n > 1 else None
        base = row_seed(params)
        grammar = None
        if params.response_format is not None:  # raises GrammarError (a ValueError)
            grammar = compile_format(
                params.response_format, self.target.tokenizer, self.target.vocab_size
            )
        for i in range(params.n):
            seed = base if i == 0 else (base + i if params.seed is not None else row_seed(params))
            seq = Sequence(
                prompt=list(prompt),
                params=params,
                max_tokens=min(params.max_tokens, ctx - len(prompt)),
                seed=seed & 0xFFFFFFFF,
                tag=tag,
                corpus=corpus,
                metrics=RequestMetrics(drafter=self.engine.draft_spec),
                group=group,
                isolate=isolate,
                on_admit=on_admit if i == 0 else None,
                grammar=grammar.row() if grammar is not None else None,
            )
            self.queue.append(seq)
            if group is not None:
                group.seqs.append(seq)
        return group.seqs[0] if group is not None else seq

    @property
    def active(self) -> int:
        return sum(r is not None for r in self.rows)

    @property
    def idle(self) -> bool:
        return (
            not self.queue
            and self.active == 0
            and not self._done
            and not self._lag
            and self._loop is None
        )

    def run(self) -> Iterator[GenerationResult]:
        """Step until every queued request has finished, yielding results as they do."""
        while not self.idle:
            yield from self.step()

    # -- one step ---------------------------------------------------------------------

    def step(self) -> list[GenerationResult]:
        """Admit, draft, verify and commit once; the results of rows that finished. Then
        a turn of the self-drafter's online learning, when its time budget allows."""
        with mx.stream(generation_stream):
            if self.modes is None:
                out = self._step()
            else:
                decoding = any(s is not None and s.decoding for s in self.rows)
                clock = self.engine.clock
                t0, n0 = clock(), self.emitted
                out = self._step()
                seconds, tokens = clock() - t0, self.emitted - n0
                for kind, n, sec in self._drained:
                    self.modes.credit(kind, n, sec)
                    tokens, seconds = tokens - n, seconds - sec
                self._drained.clear()
                # A step that only prefilled (rows joining a batch none of whose rows was
                # decoding: a job's first step, each request at batch 1) is the prompts'
                # time whatever kind is current: it measures no kind. Counted, it charged
                # a job's whole first wave of prompts to the kind whose block came first,
                # and at batch 1 each request's prompt to the block it fell in.
                if decoding:
                    rows = self.active
                    evidence = sum(d.evidence() for d in self.drafters)
                    entry = self._entry and self.engine.runs_ahead
                    self.modes.observe(self._mode, tokens, seconds, rows, evidence, entry)
            if self.engine.learner is not None:
                self.engine.learner.tick()
            return out

    def _step(self) -> list[GenerationResult]:
        kind = self._mode = self._kind if self.modes is None else self.modes.mode
        plain = not self.drafters or kind == "plain"
        # The loop where its rows can run it, else a host-synced drafting step.
        resident = kind == "loop" and self._resident_ok()
        if resident and self._loop_k() == 0:  # no chain pays at these rows: plain steps
            resident, plain = False, True
        if self._loop is not None and (not resident or self._loop.k != self._loop_k()):
            self._leave_loop()
        # A double-buffered step with none of its own kind in flight to read: its entry.
        # Where the device runs ahead, that step is the host's launch alone (and the loop's
        # first chain, drafted host-synced): it measures nothing in a trial
        # (StepModes.observe). On the CPU it holds its forward, so it counts.
        self._entry = False
        if plain and self.engine.pipeline and not self._needs_sync():
            self._entry = self._lag is None
            return self._step_plain()
        if resident:
            self._entry = self._loop is None
            return self._step_resident()
        self._read_lag()
        eng = self.engine
        self._admit()
        prefill = self._prefill_plan()
        decode = [s for s in self.rows if s is not None and s.decoding]
        t0 = time.perf_counter()
        plan = self._draft(decode) if decode else None
        if eng.profile and plan is not None:
            mx.eval([d.tokens for d in plan.drafts.values() if isinstance(d.tokens, mx.array)])
        t1 = time.perf_counter()
        segments, views = [], []
        if plan is not None:
            for seg, view in plan.segments():
                segments.append(seg)
                views.append(view)
        if prefill:
            segments.append(
                Segment([s.slot for s, _ in prefill], [c for _, c in prefill], logits="last")
            )
        if not segments:
            return self._results()
        states = [] if self._states else None
        outs = forward(self.target.model, self.cache, segments, states=states)
        if eng.profile:
            mx.eval(outs)
        chosen = [self._choices(v, o) for v, o in zip(views, outs, strict=False)]
        picks = [c for c, _ in chosen]
        lps = [lp for _, lp in chosen]
        first, first_lp = None, None
        if prefill:
            first, first_lp = self._first_tokens(prefill, outs[-1])
        # A prefill chunk is computed in its own step, even where no row's prompt ends
        # here: deferred, the chunks' graphs would pile up until the last one.
        pending = [*picks, *([first] if first is not None else [outs[-1]] if prefill else [])]
        pending += [a for lp in [*lps, first_lp] if lp is not None for a in lp]
        pending += [h for h in states or [] if h is not None]
        pending += [
            d.tokens
            for d in (plan.drafts.values() if plan else [])
            if isinstance(d.tokens, mx.array)
        ]
        mx.async_eval(pending)
        r0 = time.perf_counter()
        results = self._results() if eng.overlap else []  # host work while the device runs
        r1 = time.perf_counter()
        mx.eval(pending)  # the step's one sync
        t3 = time.perf_counter()
        cache_s = 0.0
        if plan is not None:
            host_lps = [None if lp is None else [a.tolist() for a in lp] for lp in lps]
            cache_s = self._commit(plan, [p.tolist() for p in picks], views, host_lps, states)
        if prefill:
            self._commit_prefill(
                prefill,
                first.tolist() if first is not None else None,
                None if first_lp is None else [a.tolist() for a in first_lp],
                states[-1] if states else None,
            )
        t4 = time.perf_counter()
        if plan is not None:
            # Each row's share of the step. Unprofiled, the device's forward time is in
            # verify_s (the wait at the sync), beside building the forward.
            share = 1.0 / len(decode)
            for s in decode:
                ph = s.metrics.phases
                ph["draft_s"] += (t1 - t0) * share
                ph["verify_s"] += (t3 - t1 - (r1 - r0)) * share
                ph["accept_s"] += (t4 - t3 - cache_s) * share
                ph["cache_s"] += cache_s * share
        self.steps += 1
        return results if eng.overlap else self._results()

    def _needs_sync(self) -> bool:
        """Rows whose next token needs the host first (penalties count the last token) or
        whose log-probabilities are read: plain decoding then syncs every step."""
        live = [r for r in self.rows if r is not None] + list(self.queue)
        return any(r.params.needs_host for r in live)

    def _step_plain(self) -> list[GenerationResult]:
        """Plain decoding, double-buffered like mlx-lm: this step is queued on the device
        with the previous step's tokens still there, before those are read back. A row
        that turns out to have finished (EOS) was computed once more for nothing."""
        self._admit()
        prefill = self._prefill_plan()
        lag_rows, lag_tokens = self._lag or ([], None)
        lagging = {s.uid: j for j, s in enumerate(lag_rows)}
        decode = []
        for s in self.rows:
            if s is None or s.finish_reason is not None:
                continue
            if s.uid in lagging:  # its next input is the previous step's token, on the device
                known = len(s.output) + 1
                if known < s.max_tokens:
                    decode.append(s)
            elif s.output:
                decode.append(s)
        segments = []
        if decode:
            host = np.array([0 if s.uid in lagging else s.pending for s in decode], np.int32)
            ids = mx.array(host)
            dev = [i for i, s in enumerate(decode) if s.uid in lagging]
            if dev:
                src = mx.array([lagging[decode[i].uid] for i in dev])
                ids[mx.array(dev)] = lag_tokens[src]
            segments.append(Segment([s.slot for s in decode], [[0]] * len(decode), ids=ids))
        if prefill:
            segments.append(
                Segment([s.slot for s, _ in prefill], [c for _, c in prefill], logits="last")
            )
        launched: tuple[list[Sequence], mx.array] | None = None
        if segments:
            states = [] if self._states else None
            outs = forward(self.target.model, self.cache, segments, states=states)
            if states:
                self._keep_states(decode, states[0] if decode else None)
                self._keep_prefill_states(prefill, states[-1] if prefill else None)
            rows, picks = [], []
            if decode:
                pos = self.cache.lengths[[s.slot for s in decode]] + 1  # after the input
                seeds = np.array([s.seed for s in decode], dtype=np.uint32)
                picks.append(choose(outs[0], [s.params for s in decode], seeds, pos))
                rows += decode
                for s in decode:  # its input is in the cache now
                    self.cache.lengths[s.slot] += 1
            if prefill:
                for s, c in prefill:
                    s.prefilled += len(c)
                    self.cache.lengths[s.slot] += len(c)
                done = [i for i, (s, _) in enumerate(prefill) if s.prefilled == len(s.prompt)]
                if done:
                    first, _ = self._first_tokens_of(
                        [prefill[i][0] for i in done], outs[-1], done, len(prefill)
                    )
                    picks.append(first)
                    rows += [prefill[i][0] for i in done]
            if rows:
                tokens = picks[0] if len(picks) == 1 else mx.concatenate(picks)
                mx.async_eval(tokens)
                launched = (rows, tokens)
            else:  # prefill alone, no prompt ending: computed now (see `_step`)
                mx.async_eval(outs[-1])
        results = self._results()
        if lag_rows:
            self._commit_plain(lag_rows, lag_tokens.tolist())  # the step's one sync
        self._lag = launched
        self.steps += 1
        return results

    def _draft_price(self, rows: int) -> float:
        """What a draft token a row costs to verify at `rows` rows (`token_cost`): what the
        step modes watch as the rows change."""
        return token_cost(self.engine.surface, rows, 2 * rows)

    def _choose_loop_head(self) -> FeatureHeadDrafter | None:
        """The feature head drafting chains, when one is in play and the engine runs the
        resident loop: the loop's drafter."""
        heads = [d for d in self.drafters if isinstance(d, FeatureHeadDrafter) and d.width == 1]
        return heads[0] if self.engine.resident and heads else None

    def _host_drafters(self) -> list[Drafter]:
        """The drafters a host-synced step's rows choose among, by the step modes' kind of
        the step, so that each kind's measured rate is that of its own drafters:
        - `plain`: none. A plain step syncs where a row's next token needs the host (a row
          asking for log-probabilities or penalties); it verifies one token a row all the
          same, as a double-buffered one does.
        - where the head's loop is a kind of its own beside host-synced drafting, `draft`
          drafts with the others, and the loop's kind with the head alone where the loop
          cannot run (rows joining, a row asking for log-probabilities). A host-synced
          step whose rows choose the head waits for its sequential depths: on an H100,
          labeling-256 at 64 rows, 32 ms a host-synced step of `auto` with a head, 18 ms
          of `suffix` alone, where plain steps took 10-12.
        - the loop's kind (also the head's alone, without step modes) in a step where the
          loop cannot run only because rows are joining (admitted, prefilling): the head,
          host-synced (docs/decisions.md: its drafts paid for the join steps' cost)."""
        if self.modes is None and self._mode != "loop":
            return self.drafters
        if self._mode == "plain":
            return []
        head = self._loop_head
        if head is None:
            return self.drafters
        if self._mode == "loop":
            return [head]
        return [d for d in self.drafters if d is not head]

    def _resident_ok(self) -> bool:
        """Whether this step can run in the resident loop (Engine's `resident`)."""
        if self._loop_head is None or self.cache.lanes:
            return False  # (the loop's forwards read every row from the dense block)
        rows = [s for s in self.rows if s is not None]
        if not rows or self._admissible():
            return False
        return all(s.decoding and not s.params.needs_host for s in rows)

    def _loop_k(self) -> int:
        """The resident loop's chain length: the engine's `k` where set, else the one whose
        expected tokens per unit of time are the most (`draft_length.chain_speedups`) from
        the head's acceptance by draft position in the loop (`Engine.carried(head,
        loop=True)`: carried across the engine's requests and measured by the loop as it
        runs) and this machine's costs at the rows the loop runs: the verify surface's width
        cost and the head's depths, timed. 0 where no chain beats plain steps. Chosen again
        every `LOOP_CHOOSE_EVERY` steps; a chosen length changes (leaving the loop and
        entering it again: one step's sync) only for a predicted gain of `LOOP_SWITCH` or
        more, so near-ties do not make it flap.

        Where no chain pays, the loop's acceptance is no longer measured (plain steps
        draft nothing), so a job whose first rows the head drafted badly for would never
        draft again: after `LOOP_PROBE` steps without a chain, the best length runs for one
        choice's steps all the same, and the wait doubles (to `LOOP_PROBE_MAX`) each time
        the probe leaves it not paying. (On this CPU at batch 1, with the loop forced on,
        an engine whose first pass ended predicting no chain paying ran plain steps from
        then on: 1.05x none, against 1.31x for one whose loop ran on.)"""
        if self.engine.k:
            return self.engine.k
        if self._chain is not None and self.steps - self._chain[1] < LOOP_CHOOSE_EVERY:
            return self._chain[0]
        speedups = self.loop_speedups()
        k = int(np.argmax(speedups))
        since, wait = self._probe
        if k == 0 and self.steps - since >= wait:  # a probe
            k = 1 + int(np.argmax(speedups[1:]))
            self._probe = (self.steps, min(2 * wait, LOOP_PROBE_MAX))
        elif self._chain is not None and speedups[k] < LOOP_SWITCH * speedups[self._chain[0]]:
            k = self._chain[0]
        if k and speedups[k] > 1.0:  # a chain that pays: the next probe waits from scratch
            self._probe = (self.steps, LOOP_PROBE)
        self._chain = (k, self.steps)
        return k

    def _loop_rows(self) -> int:
        """The rows a loop step computes: every slot on CUDA, else the live rows."""
        if self.cache.pad > 1:
            return self.capacity
        return max(sum(s is not None and s.finish_reason is None for s in self.rows), 1)

    def loop_speedups(self) -> np.ndarray:
        """The resident loop's predicted speedup over plain steps by chain length, 0 ..
        `K_MAX` (`draft_length.chain_speedups`), at the rows it runs now."""
        head = self._loop_head
        rows = self._loop_rows()
        draft, verify = head.step_cost(rows), self.engine.surface.verify_cost(rows)
        return chain_speedups(self.engine.carried(head, loop=True).gains(K_MAX), draft, verify)

    def _step_resident(self) -> list[GenerationResult]:
        """A step of the resident loop: the next one queued, then the one before it read
        and committed while this one runs."""
        if self._loop is None:  # entering: the head drafts the first tokens as usual
            self._read_lag()
            decode = [s for s in self.rows if s is not None and s.decoding]
            if not decode:
                return self._results()
            head = self._loop_head
            k = self._loop_k()
            draft = head.propose(decode, [k] * len(decode))
            self._loop = ResidentLoop(self, head, decode, draft.tokens[:, :k])
        prev = self._loop.launch()
        if self._loop.in_flight is not None:
            self.loop_steps[self._loop.k] += 1
        results = self._results()
        if prev is not None:
            self._commit_loop(prev)  # the step's one sync
        self.steps += 1
        return results

    def _commit_loop(self, step: Launched, last: bool = False) -> None:
        """Emit a loop step's tokens: each row's pending token's successor, and the one
        after each draft of the chain's accepted prefix. The states of the positions it
        committed are the pairs the head read in the loop (kept when it learns); `last`
        (the loop ends) hands the head each row's last one to read again, as after a
        verify step."""
        picks, accepted = step.picks.tolist(), step.accepted.tolist()
        head, w = self._loop_head, step.picks.shape[1]
        chains = self.engine.carried(head, loop=True)
        B = sum(s is not None for s in step.rows)
        finished = []
        for j, s in enumerate(step.rows):
            if s is None or s.finish_reason is not None:
                continue  # not advanced, or finished meanwhile: computed for nothing
            a = accepted[j]
            for d in self.drafters:  # no host-synced drafting this step
                s.stats[d.name].observe(0, a)
            chains.observe(w - 1, a)
            s.metrics.record_step(head.name, w - 1, a, 1 + a)
            s.batch_rows += B
            self.cache.lengths[s.slot] += 1 + a
            head.cache.lengths[s.slot] += 1 + a
            had = len(s.output)
            reason = self._emit(s, picks[j][: 1 + a], None)
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
            self._finish(s, reason)

    def _leave_loop(self) -> None:
        """Read and commit the loop's step in flight; the head reads on as after a verify."""
        step = self._loop.drain()
        self._loop = None
        if step is not None:
            with self._drain("loop"):
                self._commit_loop(step, last=True)

    def _read_lag(self) -> None:
        """Leaving double-buffered plain decoding: read and commit its step in flight."""
        if self._lag is not None:
            rows, tokens = self._lag
            self._lag = None
            with self._drain("plain"):
                self._commit_plain(rows, tokens.tolist())

    @contextmanager
    def _drain(self, kind: str) -> Iterator[None]:
        """A step of `kind` computed what this reads: the tokens and the wait go to it
        (StepModes.credit)."""
        t0, n0 = self.engine.clock(), self.emitted
        yield
        if self.modes is not None:
            self._drained.append((kind, self.emitted - n0, self.engine.clock() - t0))

    def _commit_plain(self, rows: list[Sequence], tokens: list[int]) -> None:
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
            reason = self._emit(s, [t], None)
            if reason is not None:
                self._finish(s, reason)
            elif first:
                self._admit_drafters(s)

    # -- admission and prefill --------------------------------------------------------

    def take_queued(self, which: Callable[[Sequence], bool] | None = None) -> list[Sequence]:
        """Remove and return the requests not admitted yet (those `which` picks)."""
        out = [s for s in self.queue if which is None or which(s)]
        taken = {s.uid for s in out}
        self.queue = deque(s for s in self.queue if s.uid not in taken)
        return out

    def drop(self, which: Callable[[Sequence], bool]) -> list[Sequence]:
        """Stop the rows and queued requests `which` picks (their job was cancelled)."""
        out = self.take_queued(which)
        for s in self.rows:
            if s is not None and which(s):
                for d in self.drafters:
                    d.retire(s)
                self.rows[s.slot] = None
                self.cache.release(s.slot)
                s.finish_reason = "cancelled"
                out.append(s)
        # (a plain-decoding step still in flight skips them: their finish_reason is set)
        return out

    def abandon(self) -> list[Any]:
        """Drop every row and queued request (after an engine failure); their tags."""
        tags = [s.tag for s in self.rows if s is not None] + [s.tag for s in self.queue]
        tags += [s.tag for s in self._done]
        for s in self.rows:  # drafters let go of the rows' state (a suffix row's live region)
            if s is not None:
                for d in self.drafters:
                    d.retire(s)
        self.rows = [None] * self.capacity
        self.queue.clear()
        self._done = []
        self._loop = None
        self.cache = BatchKVCache(
            self.target.num_layers, self.capacity, lane_from=self.engine.lane_from
        )
        self._draft_model_drafter = None
        self.drafters = self.engine.entry.build(self, self.engine.arg)
        self._loop_head = self._choose_loop_head()
        return tags

    def _admissible(self) -> bool:
        """Whether `_admit` would take a queued request now."""
        if not self.queue or all(r is not None for r in self.rows):
            return False
        if any(r is not None and r.isolate for r in self.rows):
            return False
        if self.queue[0].isolate and self.active:
            return False
        return self._fits(self.queue[0])

    def _admit(self) -> None:
        free = [i for i, r in enumerate(self.rows) if r is None]
        alone = any(r is not None and r.isolate for r in self.rows)
        while free and self.queue and not alone and self._fits(self.queue[0]):
            if self.queue[0].isolate and self.active:
                break  # it waits for the rows in flight to finish
            seq = self.queue.popleft()
            alone = seq.isolate
            seq.slot = free.pop(0)
            seq.t_admit = time.perf_counter()
            seq.metrics.t_start = seq.t_admit
            self.rows[seq.slot] = seq
            self._write_head(seq)
            self.cache.release(seq.slot)
            if seq.on_admit is not None:
                seq.on_admit()

    def _fits(self, seq: Sequence) -> bool:
        """Whether the rows' KV cache, with `seq` joining them, stays in the budget (a row
        alone always runs: `submit` refused those that cannot)."""
        if self.active == 0:
            return True
        need = [row_positions(len(s.prompt), s.max_tokens) for s in self.rows if s is not None]
        need.append(row_positions(len(seq.prompt), seq.max_tokens))
        return kv_bytes(need, self.cache.lane_from, self._per_position) <= self.engine.max_kv_bytes

    def _prefill_plan(self) -> list[tuple[Sequence, list[int]]]:
        """The prompt chunks to prefill this step (at most `prefill_tokens` in all, oldest
        rows first). A joining row first copies the longest prompt prefix another row holds
        in the cache (a job's prompts share their template: the system prompt, the task's
        instructions); if a longer one is being prefilled this very step by another row, it
        waits a step and copies that instead of computing it too."""
        budget = self.engine.prefill_tokens
        plan: list[tuple[Sequence, list[int]]] = []
        joining = sorted(
            (s for s in self.rows if s is not None and s.prefilled < len(s.prompt)),
            key=lambda s: s.t_admit,
        )
        share = self.engine.share_prefixes
        copies: list[tuple[int, int, int]] = []  # (donor slot, slot, positions), made at once
        for s in joining:
            if budget <= 0:
                break
            if share:
                ready, donor = self._shared(s, lambda o: o.cached if o.output else o.prefilled)
                if donor is not None and ready > s.prefilled:
                    if any(donor.slot == d for _, d, _ in copies):  # its prefix is copied first
                        self.cache.copy_prefixes(copies)
                        copies = []
                    copies.append((donor.slot, s.slot, ready))
                    s.metrics.shared_prefix += ready - s.prefilled
                    s.prefilled = ready
                coming = max((self._common(s, o, o.prefilled + len(c)) for o, c in plan), default=0)
                if coming >= s.prefilled + MIN_SHARED_PREFIX:
                    continue  # copied next step, once that row has it
            chunk = s.prompt[s.prefilled : s.prefilled + budget]
            plan.append((s, chunk))
            budget -= len(chunk)
        if copies:
            self.cache.copy_prefixes(copies)
        return plan

    def _shared(self, s: Sequence, cached_of) -> tuple[int, Sequence | None]:
        """The longest prefix of `s`'s prompt another row holds in the cache, and that row
        (the first such slot). Every row's first `PROMPT_HEAD` prompt tokens are compared at
        once; a match that runs past them is counted on."""
        mine = np.full(PROMPT_HEAD, -2, np.int32)  # never equal to a padding
        mine[: min(len(s.prompt), PROMPT_HEAD)] = s.prompt[:PROMPT_HEAD]
        same = self._heads == mine
        runs = np.where(same.all(axis=1), PROMPT_HEAD, same.argmin(axis=1))
        best, donor = 0, None
        for slot in np.flatnonzero(runs > 0).tolist():  # slot order: the first wins a tie
            o = self.rows[slot]
            if o is None or o is s or (runs[slot] <= best and runs[slot] < PROMPT_HEAD):
                continue  # it cannot beat `best` (unless its whole head matched: it may go on)
            have = cached_of(o)
            n = min(int(runs[slot]), len(s.prompt) - 1, have)
            if n == PROMPT_HEAD:
                n = self._common(s, o, have)
            if n > best:
                best, donor = n, o
        return (best, donor) if best >= MIN_SHARED_PREFIX else (0, None)

    def _write_head(self, seq: Sequence) -> None:
        """A row takes its slot: its first prompt tokens go into the slot's head."""
        head = seq.prompt[:PROMPT_HEAD]
        self._heads[seq.slot, : len(head)] = head
        self._heads[seq.slot, len(head) :] = -1

    @staticmethod
    def _common(s: Sequence, o: Sequence, have: int) -> int:
        """Prompt tokens `s` shares with the first `have` cached tokens of row `o` (never its
        whole prompt: the last token is always computed, for the first token's logits)."""
        p, q = s.prompt, o.prompt
        limit = min(len(p) - 1, len(q), have)
        n = 0
        while n < limit and p[n] == q[n]:
            n += 1
        return n

    def _first_tokens(self, prefill, logits: mx.array):
        done = [i for i, (s, c) in enumerate(prefill) if s.prefilled + len(c) == len(s.prompt)]
        if not done:
            return None, None
        return self._first_tokens_of([prefill[i][0] for i in done], logits, done, len(prefill))

    @staticmethod
    def _first_tokens_of(seqs, logits: mx.array, done: list[int], rows: int):
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
                seqs[j].grammar.single = [_single(bits[masked.index(j)])]
        tokens = choose(picked, params, seeds, pos)
        lp = None
        if any(p.logprobs for p in params):
            lp = token_logprobs(picked, params, tokens, max(p.top_logprobs for p in params))
        return tokens, lp

    def _keep_states(self, rows: list[Sequence], h: mx.array | None) -> None:
        """Row j of `rows` committed one position whose last-layer state is h[j]."""
        for j, s in enumerate(rows):
            s.states.append(Span(h, j, 1))

    def _keep_prefill_states(self, prefill, h: mx.array | None) -> None:
        """The rows whose prompt this prefill step completes keep its last position's state
        (h: one per chunk); call before the step's `prefilled` counts move on."""
        for j, (s, chunk) in enumerate(prefill):
            if s.prefilled + len(chunk) == len(s.prompt):
                s.states.append(Span(h, j, 1))

    def _commit_prefill(self, prefill, first: list[int] | None, lp=None, states=None) -> None:
        if states is not None:
            self._keep_prefill_states(prefill, states)
        firsts = iter(enumerate(first or []))
        now = time.perf_counter()
        for s, chunk in prefill:
            s.prefilled += len(chunk)
            self.cache.lengths[s.slot] += len(chunk)
            if s.prefilled < len(s.prompt):
                continue
            j, t = next(firsts)
            s.metrics.t_first = now
            record = [self._lp_record(lp, j, t)] if lp is not None and s.params.logprobs else None
            reason = self._emit(s, [t], record)
            if reason is not None:
                self._finish(s, reason)
                continue
            self._admit_drafters(s)

    def _admit_drafters(self, s: Sequence) -> None:
        """A row has its first token: each drafter takes it on, with fresh statistics."""
        for d in self.drafters:
            d.admit(s)
            s.stats[d.name] = RowPolicy(self.engine.carried(d))

    # -- drafting ---------------------------------------------------------------------

    def _draft(self, decode: list[Sequence]) -> StepPlan:
        eng = self.engine
        B = len(decode)
        ctx = self.target.context_length
        caps = [max(0, min(K_MAX, s.room - 1, ctx - s.cached - 2)) for s in decode]
        drafters = self._host_drafters()
        lookups: dict[str, Draft] = {}
        for d in drafters:
            if d.lookup:
                lookups[d.name] = d.propose(decode, caps)
        choice: list[Drafter | None] = [None] * B
        ks = [0] * B
        offers: list[Offer] | None = None
        if drafters and eng.k is not None:  # fixed k: the first drafter with something
            for i in range(B):
                for d in drafters:
                    avail = lookups[d.name].sizes[i] if d.lookup else caps[i]
                    if avail:
                        choice[i], ks[i] = d, min(eng.k, avail)
                        break
        elif drafters:
            offers = []
            marginal = max(eng.surface.relative(B, B + 1) - 1.0, 1e-6)
            costs = {d.name: d.step_cost(B) for d in drafters if not d.lookup and eng.k is None}
            for i, s in enumerate(decode):
                best, best_rate = None, 1.0
                for d in drafters:
                    offer = self._offer(d, s, i, lookups, caps[i])
                    if offer is None:
                        continue
                    rate = _alone(offer, marginal, costs.get(d.name, 0.0) / B)
                    warm = offer.forced and not offer.probe
                    if warm or rate > best_rate:
                        best, best_rate = (d, offer), (np.inf if warm else rate)
                if best is None:  # nothing pays: re-probe a due drafter with one token
                    for d in (d for d in drafters if not d.calibrated):
                        pol = s.stats[d.name]
                        avail = lookups[d.name].sizes[i] if d.lookup else caps[i]
                        if pol.probe_due() and avail:
                            best = (d, Offer(pol.stats.gains(1), _group(d), forced=1))
                            break
                choice[i] = best[0] if best else None
                offers.append(best[1] if best else Offer(np.zeros(0)))
            ks = allocate(offers, eng.surface, costs)
        drafts: dict[str, Draft] = {}
        members: dict[str, list[int]] = {}
        for i, d in enumerate(choice):
            if d is not None and ks[i] > 0:
                members.setdefault(d.name, []).append(i)
            else:
                choice[i] = None
        for d in drafters:
            idx = members.get(d.name)
            if not idx:
                continue
            if d.lookup:
                full = lookups[d.name]
                sub = Draft(
                    sizes=[full.sizes[i] for i in idx],
                    tokens=[full.tokens[i] for i in idx],
                    parents=None if full.parents is None else [full.parents[i] for i in idx],
                    chances=None if full.chances is None else [full.chances[i] for i in idx],
                    source=full.source,
                )
                drafts[d.name] = sub.truncate([ks[i] for i in idx])
            else:
                drafts[d.name] = d.propose([decode[i] for i in idx], [ks[i] for i in idx])
        if offers is not None:
            self._gate(decode, ks, offers, drafts, members)
        static = self.capacity if self.cache.pad > 1 else None
        return StepPlan(decode, choice, drafts, members, self.drafters, static)

    def _gate(self, decode, ks, offers, drafts: dict[str, Draft], members) -> None:
        """Where verifying a token costs real time at this batch, rows drafted by a drafter
        that can say how sure it is keep only the nodes that pay (draft_length.gate)."""
        sure = [n for n, dr in drafts.items() if dr.confidence is not None]
        B = len(decode)
        if not sure or token_cost(self.engine.surface, B, B + sum(ks)) < GATE_COST:
            return
        chances: dict[int, list[float]] = {}
        for name in sure:
            d = next(x for x in self.drafters if x.name == name)
            rows = members[name]
            rows_chances = d.chances([decode[i] for i in rows], drafts[name])
            chances.update(zip(rows, rows_chances, strict=True))
        kept = gate(offers, ks, chances, self.engine.surface)
        for name in sure:
            drafts[name] = drafts[name].truncate([kept[i] for i in members[name]])

    def _offer(self, d: Drafter, s: Sequence, i: int, lookups, cap: int) -> Offer | None:
        pol: RowPolicy = s.stats[d.name]
        if d.lookup:
            look = lookups[d.name]
            n = look.sizes[i]
            if n == 0:
                return None
            gains = (
                np.minimum.accumulate(np.asarray(look.chances[i][:n]))
                if look.chances
                else pol.stats.gains(n)
            )
        else:
            # A penalised row's adjustment depends on the drafted tokens: only host drafts.
            if cap == 0 or s.params.frequency_penalty or s.params.presence_penalty:
                return None
            gains = pol.stats.gains(cap)
        # A calibrated drafter's chances are learned across rows: no per-row warm-up.
        forced = min(K_INIT, len(gains)) if pol.warming() and not d.calibrated else 0
        if not forced and hasattr(d, "chances") and pol.probe_due():
            # The gate dropped its nodes a while: a probe teaches the drafter's chances. It
            # holds only where the row would choose this drafter (`_draft`): against a better
            # drafter's offer it would give that row's step away (a row drafting a job's
            # answer template from the suffix index, probed every `PROBE_EVERY` steps by a
            # head that never drafts for it).
            return Offer(gains, _group(d), 1, probe=True)
        return Offer(gains, _group(d), forced)

    # -- verification -----------------------------------------------------------------

    def _choices(self, view: SegmentView, logits: mx.array):
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

    def _commit(
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
                        row_lp[i] = [self._lp_record(lp, off + j, pick[off + j]) for j in range(n)]
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
                len(toks) if parents is None else max(_depths([-1] + [p + 1 for p in parents]))
            )
            for other in self.drafters:
                s.stats[other.name].observe(proposed if other is d else 0, len(path))
            emitted = [toks[p] for p in path] + [nxt]
            s.metrics.record_step(  # a row whose nodes the gate dropped verified alone
                draft.source if draft is not None and k else "none", k, len(path), len(emitted)
            )
            s.batch_rows += B
            self.cache.lengths[s.slot] += 1 + len(path)
            lps = None
            if i in row_lp:  # the emitted tokens are the target's choices after these nodes
                nodes = [0] + [p + 1 for p in path]
                lps = [row_lp[i][n] for n in nodes]
            if s.grammar is not None:  # whether each emitted token was forced, in order
                s.grammar.single = [s.grammar.single[n] for n in [0] + [p + 1 for p in path]]
            reason = self._emit(s, emitted, lps)
            if reason is not None:
                finished.append((s, reason))
        if states is not None:
            self._keep_committed_states(plan.decode, states, kept, spans)
        c0 = time.perf_counter()
        if moves_rows:  # before the lengths moved on: compact reads them as the base
            for r, p in zip(moves_rows, moves_paths, strict=True):
                self.cache.lengths[r] -= len(p)
            self.cache.compact(moves_rows, moves_paths)
            for r, p in zip(moves_rows, moves_paths, strict=True):
                self.cache.lengths[r] += len(p)
            if self.engine.profile:
                mx.eval(self.cache.state())
        cache_s = time.perf_counter() - c0
        for name, draft in plan.drafts.items():
            d = next(x for x in self.drafters if x.name == name)
            d.commit([plan.decode[i] for i in plan.members[name]], draft, paths[name])
        for seq, reason in finished:  # after the drafters rolled back their state
            self._finish(seq, reason)
        return cache_s

    @staticmethod
    def _keep_committed_states(decode, states, kept, spans) -> None:
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

    def _emit(self, s: Sequence, tokens: list[int], lps: list | None) -> str | None:
        """Append a row's new tokens in order; the finish reason at the first that ends it
        (EOS, a stop sequence, max_tokens), else None. Tokens past it are dropped: a draft
        that crosses a stop sequence is cut there."""
        eos = self.target.eos_token_ids
        stops = s.params.stop
        g = s.grammar
        for j, t in enumerate(tokens):
            if t in eos:
                return "stop"
            s.output.append(t)
            self.emitted += 1
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
                text = self.target.decode(s.output)
                cuts = [text.find(x) for x in stops if isinstance(x, str) and x in text]
                if cuts:
                    s.text_end = min(cuts)
                    return "stop"
            if len(s.output) >= s.max_tokens:
                return "length"
        return None

    def _lp_record(self, lp, node: int, token: int) -> dict:
        """{"token", "id", "logprob", "top_logprobs"} of the token chosen at `node`."""
        picked, top_ids, top_lps = lp
        dec = self.target.decode
        return {
            "token": dec([token]),
            "id": token,
            "logprob": picked[node],
            "top_logprobs": [
                {"token": dec([t]), "id": t, "logprob": v}
                for t, v in zip(top_ids[node], top_lps[node], strict=True)
            ],
        }

    # -- finishing --------------------------------------------------------------------

    def _finish(self, s: Sequence, reason: str) -> None:
        s.finish_reason = reason
        s.metrics.t_end = time.perf_counter()
        spans = s.read_states + s.states  # a learning feature head's pairs (before retire)
        for d in self.drafters:
            d.retire(s)
        if self.engine.learner is not None:
            states = [gather(spans)] if spans else None
            self.engine.learner.observe(s.prompt, s.output, states)
        self.rows[s.slot] = None
        self.cache.release(s.slot)
        self._done.append(s)

    def _results(self) -> list[GenerationResult]:
        done, self._done = self._done, []
        out = []
        for s in done:
            if s.group is not None:
                s.group.finished.append(s)
                if len(s.group.finished) < len(s.group.seqs):
                    continue  # the request's other answers are still running
                seqs = s.group.seqs
            else:
                seqs = [s]
            out.append(self._result(seqs))
        return out

    def _result(self, seqs: list[Sequence]) -> GenerationResult:
        choices = []
        for s in seqs:
            text = self.target.decode(s.output)
            if s.text_end is not None:
                text = text[: s.text_end]
            lp = list(s.logprobs) if s.params.logprobs else None
            choices.append(Choice(list(s.output), text, s.finish_reason, lp))
        first = seqs[0]
        timing = first.metrics.timing(len(first.output))
        steps = first.metrics.verify_steps
        timing["batch_size"] = round(first.batch_rows / steps, 2) if steps else 1.0
        timing["engine_wait_s"] = round((first.t_admit or first.t_submit) - first.t_submit, 6)
        speculative = first.metrics.speculative()
        if len(seqs) > 1:  # the answers' draft counts together
            for key in ("draft_tokens", "accepted_tokens", "verify_steps"):
                speculative[key] = sum(s.metrics.speculative()[key] for s in seqs)
        if first.grammar is not None:  # tokens the grammar forced, seconds spent in masks
            speculative["forced_tokens"] = sum(s.grammar.forced_tokens for s in seqs)
            timing["mask_s"] = round(sum(s.grammar.mask_s for s in seqs), 6)
        if self.engine.learner is not None:  # the self-drafter version serving as it ended
            speculative["adapter_version"] = self.engine.learner.version
        return GenerationResult(
            tokens=choices[0].tokens,
            text=choices[0].text,
            finish_reason=choices[0].finish_reason,
            prompt_tokens=len(first.prompt),
            speculative=speculative,
            timing=timing,
            tag=first.tag,
            choices=choices,
        )


@dataclass
class _Group:
    """The `n` answers of one request."""

    n: int
    seqs: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)


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
            positions += [len(s.history) + dd for dd in _depths(node_parents)]
        mask_bits = segment_masks(masked) if masked else []
        for (g, _, _), bits in zip(masked, mask_bits, strict=True):
            g.single = [_single(b) for b in bits]
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


def _single(bits: np.ndarray) -> bool:
    """Whether a node's mask allows one token only (the grammar forces it)."""
    words = bits.view(np.uint32)
    words = words[words != 0]
    return len(words) == 1 and int(words[0]) & (int(words[0]) - 1) == 0


def _depths(parents: list[int]) -> list[int]:
    d = [0] * len(parents)
    for j in range(1, len(parents)):
        d[j] = d[parents[j]] + 1
    return d


def _group(d: Drafter) -> str | None:
    return None if d.lookup else d.name


def _alone(offer: Offer, marginal: float, step_cost: float) -> float:
    """The best rate one row gets from an offer alone (tokens per plain-step cost)."""
    if not len(offer.gains):
        return 1.0
    m = np.arange(1, len(offer.gains) + 1)
    rates = (1.0 + np.cumsum(offer.gains)) / (1.0 + m * (marginal + step_cost))
    return float(rates.max())
