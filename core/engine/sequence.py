"""One request in a batch: its tokens, parameters, random keys, drafter state and metrics."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from .metrics import RequestMetrics
from .sampling import GenerationParams

_uids = itertools.count()


@dataclass
class Sequence:
    """A request from submission to its last token.

    The target's cache row holds `prompt + output[:-1]`; `output[-1]` (the pending token)
    is fed with the next step's draft.

    Attributes:
        prompt: prompt token ids.
        params: generation parameters (greedy or sampling, max_tokens, seed).
        max_tokens: tokens to generate at most (params.max_tokens capped by the context).
        seed: the request's 32-bit seed: with the position it fixes every sampled token
            (sampling.choose), whichever rows share its batch and whatever was drafted.
        tag: the caller's handle (an item id, a custom_id), returned with the result.
        slot: its row in the batch's caches (-1 while queued).
        prefilled: prompt tokens already in the target cache.
        output: generated tokens (EOS excluded once finished).
        finish_reason: None while running, then "stop" or "length".
        state: per-drafter state of this row, keyed by drafter name.
        stats: per-drafter acceptance statistics of this row (AcceptanceStats), keyed by kind.
        metrics: what `GenerationResult.speculative` and `.timing` report.
    """

    prompt: list[int]
    params: GenerationParams
    max_tokens: int
    seed: int
    tag: Any = None
    uid: int = field(default_factory=lambda: next(_uids))
    slot: int = -1
    prefilled: int = 0
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    state: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(drafter=""))
    logprobs: list = field(default_factory=list)  # per generated token, when asked
    text_end: int | None = None  # the answer's text ends here (a stop string began)
    group: Any = None  # the request's `n` answers, when it asked for several
    corpus: Any = None  # the job whose suffix index it drafts from and adds its answer to
    isolate: bool = False  # runs alone: no other row shares its steps
    on_admit: Any = None  # called when the row joins the batch
    t_submit: float = field(default_factory=time.perf_counter)
    t_admit: float | None = None
    batch_rows: int = 0  # sum over its decode steps of the rows in the step (for the mean)
    # The target's last-layer states at the positions it committed since a drafter that
    # reads them (`reads_states`: the feature head) last did, as spans of the steps' outputs
    # (states.Span); kept only for such a one.
    states: list = field(default_factory=list)
    # Those states once read (spans too), kept for a learning feature head: with `states`
    # they are the row's pairs, which its online learner then needs no forward for.
    read_states: list = field(default_factory=list)
    # Its grammar's state (grammar.RowGrammar) when it asks for a response_format, else None.
    grammar: Any = None

    @property
    def history(self) -> list[int]:
        """Prompt + output: `history[-1]` is the pending token once decoding started."""
        return self.prompt + self.output

    @property
    def pending(self) -> int:
        return self.output[-1]

    @property
    def cached(self) -> int:
        """Tokens in the target cache row."""
        return self.prefilled if not self.output else len(self.prompt) + len(self.output) - 1

    @property
    def decoding(self) -> bool:
        return bool(self.output) and self.finish_reason is None

    @property
    def room(self) -> int:
        """Tokens it may still emit."""
        return self.max_tokens - len(self.output)
