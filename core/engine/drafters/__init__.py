"""The drafter registry: one entry per `--draft` form (spec, validation, help, build).

Adding a drafter is one file implementing `base.Drafter` and one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import Draft, DraftContext, Drafter


@dataclass(frozen=True)
class Entry:
    """One `--draft` form.

    Attributes:
        name: the spec's head (`early-exit` in `early-exit:8`).
        arg: what follows the colon ("L", "NAME", "SHAPE"), None when nothing may, "SHAPE?"
            when it is optional.
        help: one line for `--help` and error messages.
        build: (context, arg) -> the drafters in play for this spec (`auto`: several).
        check: validates `arg` (raises ValueError), before anything is loaded.
    """

    name: str
    arg: str | None
    help: str
    build: Callable[[DraftContext, str | None], list[Drafter]]
    check: Callable[[str], None] | None = None

    @property
    def form(self) -> str:
        if self.arg is None:
            return self.name
        if self.arg.endswith("?"):
            return f"{self.name} | {self.name}:{self.arg[:-1]}"
        return f"{self.name}:{self.arg}"


def _layer(arg: str) -> None:
    if not arg.isdigit():
        raise ValueError(f"early-exit takes a layer number, got {arg!r}")


def _adapter_layer(arg: str) -> None:
    if not arg.isdigit():
        raise ValueError(f"adapter takes a layer number, got {arg!r}")


def _ngram(ctx: DraftContext, arg):
    from .ngram import NgramDrafter

    return [NgramDrafter(ctx.target)]


def _early_exit(ctx: DraftContext, arg):
    from .early_exit import EarlyExitDrafter

    return [EarlyExitDrafter(ctx.target, ctx.cache, int(arg))]


def _draft_model(ctx: DraftContext, arg):
    return [ctx.draft_model()]


def _suffix(ctx: DraftContext, arg):
    from .suffix import SuffixDrafter

    return [SuffixDrafter(ctx.target, ctx.corpora)]


def _width(arg: str) -> None:
    if not arg.isdigit() or int(arg) < 1:
        raise ValueError(f"head takes a tree width (1 = a chain), got {arg!r}")


def _adapter(ctx: DraftContext, arg, width: int | None = None):
    adapter = ctx.adapter
    if adapter.kind == "feature-head":
        from .feature_head import WIDTH, FeatureHeadDrafter

        head = FeatureHeadDrafter(
            ctx.target,
            ctx.capacity,
            adapter,
            width or WIDTH,
            plain_ms=ctx.plain_ms,
            timings=ctx.head_timings,
        )
        head.keep = ctx.learns  # its learner takes the states it read
        return [head]
    from .adapter import AdapterDrafter

    return [AdapterDrafter(ctx.target, ctx.cache, adapter)]


def stored_adapter(target, name: str, arg: str | None, untrained: bool = False, pricing=None):
    """The stored self-drafter a spec uses, loaded once per engine (None when it uses none):
    of those stored (at layer L when given), the one whose measured agreement promises the
    most speedup at the verify cost `pricing()` gives (store.promise; called only for a
    spec that uses one, as it may read the kept surface; None or giving None: width free).

    `adapter[:L]` and `head` raise AdapterError (a ValueError naming `applespec calibrate`)
    when no usable one is stored, unless `untrained` (online learning) and L is given or the
    spec is `head`: then an untrained adapter at L (a copy of layer L) or an untrained head
    starts; `auto` takes the best one that loads, else goes without. `adapter` (no L) and
    `auto` consider every kind.
    """
    if name not in ("adapter", "auto", "head"):
        return None
    from ..adapters.store import AdapterError, best

    verify_cost = pricing() if pricing is not None else None
    if name == "head":
        try:
            return best(target, verify_cost=verify_cost, kind="feature-head")
        except AdapterError:
            if not untrained:
                raise
        from ..adapters.head import new_head_adapter

        return new_head_adapter(target.model)
    if name == "adapter":
        try:
            return best(target, int(arg) if arg else None, verify_cost)
        except AdapterError:
            if not (untrained and arg):
                raise
        from ..adapters.block import new_adapter

        return new_adapter(target.model, int(arg))
    try:
        return best(target, verify_cost=verify_cost)
    except AdapterError:
        return None  # a corrupt or foreign file: the other drafters draft


def _head(ctx: DraftContext, arg):
    return _adapter(ctx, None, int(arg) if arg else None)


def _forced(ctx: DraftContext, arg):
    from .forced import ForcedDrafter

    return [ForcedDrafter()]


def _auto(ctx: DraftContext, arg):
    # Prompt lookup, the job's suffix index, the draft model when one is configured and
    # the best stored self-drafter when there is one; each row uses the one whose measured
    # acceptance promises the most tokens per unit of time. The grammar's forced tokens
    # first: they draft only for rows with a response_format.
    out = _forced(ctx, None) + _ngram(ctx, None) + _suffix(ctx, None)
    if ctx.draft_model is not None:
        out.append(ctx.draft_model())
    if ctx.adapter is not None:
        out += _adapter(ctx, None)
    return out


def _tree(ctx: DraftContext, arg):
    from .tree import TreeDrafter

    return [TreeDrafter(ctx.target)]


ENTRIES = [
    Entry("none", None, "no drafting: plain decoding", lambda e, a: []),
    Entry("ngram", None, "prompt lookup on characters and tokens", _ngram),
    Entry(
        "early-exit", "L", "the target's first L layers draft (shared cache)", _early_exit, _layer
    ),
    Entry("draft-model", "NAME", "a small model sharing the tokenizer", _draft_model),
    Entry("suffix", None, "the job's earlier answers: their most frequent continuation", _suffix),
    Entry(
        "adapter",
        "L?",
        "a trained self-drafter (`applespec calibrate`): the best stored, or at layer L",
        _adapter,
        _adapter_layer,
    ),
    Entry(
        "head",
        "W?",
        "the trained feature head over the target's last states (`calibrate --exit-layer"
        " head`); W: its tree's width (1 = a chain)",
        _head,
        _width,
    ),
    Entry("tree", None, "per-row token trees of prompt-lookup candidates", _tree),
    Entry("forced", None, "the tokens a row's response_format grammar forces", _forced),
    Entry("auto", None, "per row: whichever drafter promises the most (default)", _auto),
]
REGISTRY = {e.name: e for e in ENTRIES}


def forms() -> str:
    """Every valid spec form, for help texts and errors."""
    return " | ".join(e.form for e in ENTRIES)


def parse(spec: str) -> tuple[Entry, str | None]:
    """`early-exit:8` -> (its entry, "8"). Raises ValueError naming the valid forms."""
    head, sep, arg = spec.partition(":")
    entry = REGISTRY.get(head)
    if entry is not None:
        optional = entry.arg is not None and entry.arg.endswith("?")
        if not sep and (entry.arg is None or optional):
            return entry, None
        if sep and arg and entry.arg is not None:
            if entry.check is not None:
                entry.check(arg)
            return entry, arg
    raise ValueError(f"unknown drafter {spec!r}; expected one of: {forms()}")


__all__ = [
    "ENTRIES",
    "REGISTRY",
    "Draft",
    "Drafter",
    "Entry",
    "forms",
    "parse",
    "stored_adapter",
]
