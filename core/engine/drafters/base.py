"""The drafter protocol: every proposer (prompt lookup, early exit, draft models, trees, and
later trained or job-level drafters) drafts for rows of a batch and hands the engine a
`Draft`; one scorer verifies it and one acceptance routine decides what each row keeps.

Two kinds of drafter, one protocol:

- lookups (`lookup = True`: prompt lookup, trees of lookups) are cheap host work: the engine
  asks each row for up to `K_MAX` tokens, then keeps the prefix its policy pays for;
- model drafters (`lookup = False`: early exit, a draft model) cost device time per token:
  the engine picks each row's k first and asks for exactly that many.

A model drafter may also say how sure it is: its draft's `confidence` (on the device) and a
`chances(seqs, draft)` method that reads it back and calibrates it per node. Where verifying a
token costs real time, the engine asks for them and verifies only the nodes that pay
(`draft_length.gate`).

A row's life: `admit(seq)` once its prompt is in the target cache, then per verify step
`propose(seqs, ks)` and `commit(seqs, draft, paths)`, and `retire(seq)` when it finishes.
Per-row state lives in `seq.state[drafter.name]`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import mlx.core as mx

if TYPE_CHECKING:
    from ..sequence import Sequence


@dataclass
class Draft:
    """Draft nodes for some rows of a batch (one drafter, one step).

    Node i of a row follows its parent; -1 = the row's pending token (the tree's root).

    Attributes:
        sizes: (R,) draft nodes per row (0 = the row only verifies its pending token).
        tokens: per row, its node tokens (host lists), or (R, K) int32 on the device
            (model drafters: no host sync before the verify step).
        parents: per row, each node's parent (-1 = root), or None for chains.
        probs: (R, K, V) the distribution each node was drawn from (sampled rows of a model
            drafter), else None: deterministic, one-hot.
        hidden: packed (sum(sizes + 1), D) hidden states at `start_layer` for each row's
            [pending token, nodes...] (early exit), else None.
        start_layer: where verification resumes when `hidden` is given.
        chances: per row, each node's estimated chance of being accepted (lookup trees),
            else None (the engine uses the row's per-position statistics).
        confidence: (R, K) on the device: a model drafter's probability of each chain node
            under its own distribution, which the drafter's `chances` calibrates where the
            engine asks (a host sync), else None.
        source: the drafter's name (metrics attribute acceptance to it).
    """

    sizes: list[int]
    tokens: list[list[int]] | mx.array
    parents: list[list[int]] | None = None
    probs: mx.array | None = None  # (R, K, V)
    hidden: mx.array | None = None  # (sum(sizes + 1), D)
    start_layer: int = 0
    chances: list[list[float]] | None = None
    confidence: mx.array | None = None  # (R, K)
    source: str = ""

    def truncate(self, ks: list[int]) -> Draft:
        """The first ks[r] nodes of each row (a tree's nodes are in best-first order, so a
        prefix is still a tree). A device chain keeps its arrays: its sizes say how much of
        each row is verified."""
        sizes = [min(k, s) for k, s in zip(ks, self.sizes, strict=True)]
        if isinstance(self.tokens, mx.array):
            if self.hidden is not None or self.probs is not None:
                raise ValueError("a draft with states or distributions keeps its length")
            return Draft(
                sizes=sizes, tokens=self.tokens, confidence=self.confidence, source=self.source
            )
        return Draft(
            sizes=sizes,
            tokens=[t[:k] for t, k in zip(self.tokens, ks, strict=True)],
            parents=None
            if self.parents is None
            else [p[:k] for p, k in zip(self.parents, ks, strict=True)],
            chances=None
            if self.chances is None
            else [c[:k] for c, k in zip(self.chances, ks, strict=True)],
            source=self.source,
        )

    def host_tokens(self, r: int) -> list[int]:
        """Row r's node tokens (host drafts only)."""
        return list(self.tokens[r][: self.sizes[r]])


class Drafter(Protocol):
    """What the engine asks of a drafter (see the module docstring)."""

    name: str  # its spec, e.g. "ngram", "early-exit:8"
    kind: str  # acceptance-statistics key and prior (draft_length.PRIORS)
    lookup: bool  # True: cheap host proposals truncated by the policy
    calibrated: bool  # True: its `chances` are learned across rows (no per-row warm-up/probes)
    # Its acceptance per draft position where measured offline (a calibrated self-drafter's
    # held-out agreement of its first token), or None: its kind's guessed prior and a
    # per-row warm-up.
    prior: tuple[float, ...] | None

    def admit(self, seq: Sequence) -> None:
        """A row joins: its prompt is in the target cache, `seq.output[-1]` pending."""

    def propose(self, seqs: list[Sequence], ks: list[int]) -> Draft:
        """Up to ks[r] draft nodes after each row's history (a lookup may offer fewer)."""

    def commit(self, seqs: list[Sequence], draft: Draft, paths: list[list[int]]) -> None:
        """The target kept, per row, the nodes on `paths[r]` (draft indices, root excluded,
        in order): roll any own state back to the row's new history."""

    def retire(self, seq: Sequence) -> None:
        """The row finished: drop its state."""

    def step_cost(self, rows: int) -> float:
        """Cost of one drafting step over `rows` rows, in units of one plain target step at
        that batch size (0 for lookups)."""

    def evidence(self) -> int:
        """How much this drafter has learned from the batch's finished rows (a suffix
        index's answers; 0 for drafters that do not learn): the batch re-measures drafting
        against plain steps each time it doubles."""


@dataclass
class DraftContext:
    """What a batch hands the drafters it builds (drafters/__init__.py's entries).

    Attributes:
        target: the target model.
        cache: the batch's target KV cache (a self-drafter reads the target's early layers).
        capacity: the batch's rows.
        adapter: the engine's stored self-drafter, if any.
        draft_model: the engine's draft model's drafter for this batch (built on first use),
            None without a draft model.
        plain_ms: rows -> one plain target step's cost at that many rows (the verify surface).
        head_timings: the feature head's step timings on this machine, kept across batches.
        learns: whether the self-drafter learns online (it then keeps the states it read).
        corpora: per job, the suffix index of its finished answers.
    """

    target: Any
    cache: Any
    capacity: int
    adapter: Any
    draft_model: Callable[[], Drafter] | None
    plain_ms: Callable[[int], float]
    head_timings: dict
    learns: bool
    corpora: Any
