"""Offline calibration: a workload's prompts -> a trained, measured, stored adapter.

The distinct prompts are split into training and held-out prompts (a seeded hash: the
held-out ones are never trained on); the target answers them all, batched (greedy, plus
sampled answers to the training prompts); the adapter starts as a copy of layer L and is
trained on the training answers; agreement with the full model is measured on the held-out
answers before, along the way (the learning curve) and after.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import mlx.core as mx

from core.engine.adapters.block import new_adapter, target_size, weight_share
from core.engine.adapters.head import new_head_adapter
from core.engine.adapters.head import weight_share as head_share
from core.engine.adapters.store import model_key, promise, save
from core.models import LoadedModel

from .adapter import TrainConfig, evaluate, train
from .data import answer, answer_cached, coverage, features, features_cached, split, top_tokens
from .head import head_examples, train_head


@dataclass
class Calibration:
    """What one calibration measured (agreements are held-out top-1, KL in nats).

    Attributes:
        kind: "early-exit" (an adapter at `layer`) or "feature-head" (`layer` is then the
            target's layer count: the head reads the states after the last layer).
        early_exit: plain early exit at L (no trained block; None for a feature head).
        before: the untrained adapter (layer L copied: early exit at L + 1).
        after: the trained adapter.
        draft_vocab: the reduced draft vocabulary's size (None: the whole vocabulary); the
            adapter's agreements are then through it.
        vocab_coverage: the share of the held-out answers' tokens inside that vocabulary
            (the agreement's ceiling; None without one).
        curve: [(training positions seen, agreement)].
        second: a feature head's agreement on the second draft token (it reads its own
            predicted state), None for an adapter.
        path: where the adapter was stored (None: not stored).
        draft_share: the share of the target's weights one draft token reads.
        draft_length, speedup: what `after` promises (store.promise): the draft length
            that pays most and its expected speedup over plain steps, at the verify cost
            the caller gave (default: width free, an accelerator at batch 1).
    """

    model: str
    layer: int
    params: int
    params_share: float
    train_prompts: int
    held_out_prompts: int
    train_positions: int
    held_out_positions: int
    early_exit: float | None
    before: float
    after: float
    kl_before: float
    kl_after: float
    tokens: int
    curve: list[tuple[int, float]] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    draft_vocab: int | None = None
    vocab_coverage: float | None = None
    path: str | None = None
    draft_share: float = 0.0
    draft_length: int = 0
    speedup: float = 1.0
    kind: str = "early-exit"
    second: float | None = None

    def to_json(self) -> dict:
        return asdict(self)


Progress = Callable[[str, int, int], None]  # (phase, done, total)


def calibrate(
    target: LoadedModel,
    prompts: list[list[int]],
    layer: int | str,
    max_tokens: int | list[int] = 128,
    config: TrainConfig | None = None,
    held_out: float = 0.2,
    samples: int = 2,
    temperature: float = 0.7,
    store: bool = True,
    answers: Path | None = None,
    draft_vocab: int = 0,
    progress: Progress = lambda phase, done, total: None,
    verify_cost: Callable[[int], float] | None = None,
    memo: dict | None = None,
    passes: int | None = None,
) -> Calibration:
    """Train, measure and (with `store`) keep an early-exit adapter at `layer`, or with
    `layer` "head" the feature head over the target's last states (core/engine/adapters/head.py). With
    `answers`, the target's answers are kept in that file (and their features at the layer
    beside it, `<answers>.L<layer>.safetensors`) and reused by a later run on the same model,
    prompts and settings (answering and the features are most of a short calibration). With
    `draft_vocab`, the draft head scores only that many tokens the training answers
    hold most (a cheaper draft token, and cheaper training). `verify_cost` prices the
    adapter's promise (store.promise). `memo`, a dict the caller keeps, holds the answers
    between calls on the same prompts (calibrating several layers answers once). `passes`,
    when given, replaces the config's token count with that many passes over the training
    positions (and a learning-curve point every eighth of them).

    Raises:
        ValueError: a layer out of range, or fewer than two distinct prompts.
    """
    cfg = config or TrainConfig()
    is_head = layer == "head"
    # (checks the layer first)
    adapter = new_head_adapter(target.model) if is_head else new_adapter(target.model, layer)
    caps = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
    cap_of = {repr(p): c for p, c in zip(prompts, caps, strict=True)}
    train_p, held_p = split(prompts, held_out, cfg.seed)
    if not train_p or not held_p:
        raise ValueError(
            f"calibration needs at least two distinct prompts (some held out), got {len(train_p) + len(held_p)}"
        )
    times = {}
    t0 = time.perf_counter()
    n_answers = len(train_p) * (1 + samples) + len(held_p)
    done = [0]

    def answered(_tokens: int) -> None:
        done[0] += 1
        progress("answers", done[0], n_answers)

    def make():
        train_ex = answer(
            target,
            train_p,
            [cap_of[repr(p)] for p in train_p],
            samples=samples,
            temperature=temperature,
            seed=cfg.seed,
            on_result=answered,
        )
        held_ex = answer(target, held_p, [cap_of[repr(p)] for p in held_p], on_result=answered)
        return train_ex + held_ex

    digest = hashlib.sha256(repr((train_p, held_p, caps)).encode()).hexdigest()[:16]
    key = {
        "model": model_key(target),
        "prompts": digest,
        "samples": samples,
        "temperature": temperature,
        "seed": cfg.seed,
    }
    memo_key = repr(sorted(key.items()))
    if memo is not None and memo_key in memo:
        examples, reused = memo[memo_key], True
    else:
        examples, reused = answer_cached(answers, key, make)
        if memo is not None:
            memo[memo_key] = examples
    n_train = len(train_p) * (1 + samples)
    train_ex, held_ex = examples[:n_train], examples[n_train:]
    times["answers_s" if not reused else "answers_reused_s"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    feats_path = (
        None if answers is None else answers.with_name(f"{answers.name}.L{layer}.safetensors")
    )
    at = 1 if is_head else layer  # the head reads only the final states; layer 1 is cheapest
    feats, feats_reused = features_cached(
        feats_path,
        {**key, "layer": layer},
        lambda: features(target, train_ex, at) + features(target, held_ex, at),
    )
    train_f, held_f = feats[: len(train_ex)], feats[len(train_ex) :]
    if passes:
        total = passes * sum(f.n for f in train_f)
        cfg = replace(cfg, tokens=total, eval_every=max(1, total // 8))
    times["features_s" if not feats_reused else "features_reused_s"] = time.perf_counter() - t1
    early = None if is_head else evaluate(target.model, None, held_f)[0]
    t2 = time.perf_counter()
    seen = [0]

    def stepped(n: int) -> None:
        seen[0] += n
        progress("train", min(seen[0], cfg.tokens), cfg.tokens)

    if draft_vocab:
        adapter.vocab = top_tokens(train_ex, draft_vocab, target.eos_token_ids)
    if is_head:
        result = _train_head(target, adapter, train_ex, train_f, held_ex, held_f, cfg, stepped)
    else:
        result = train(target.model, adapter, train_f, held_f, cfg, on_step=stepped)
    if not all(mx.isfinite(v).all().item() for v in adapter.trainable().values()):
        raise ValueError(
            f"training the {'feature head' if is_head else f'adapter at layer {layer}'} "
            "diverged (non-finite weights); "
            f"nothing stored: try a lower learning rate (--lr, now {cfg.lr:g})"
        )
    times["train_s"] = time.perf_counter() - t2
    params = adapter.size()
    report = Calibration(
        model=target.name,
        layer=adapter.layer,
        params=params,
        params_share=params / target_size(target.model),
        train_prompts=len(train_p),
        held_out_prompts=len(held_p),
        train_positions=sum(f.n for f in train_f),
        held_out_positions=sum(f.n for f in held_f),
        early_exit=early,
        before=result.before,
        after=result.after,
        kl_before=result.kl_before,
        kl_after=result.kl_after,
        tokens=result.tokens,
        curve=result.curve,
        seconds={k: round(v, 2) for k, v in times.items()},
        draft_vocab=None if adapter.vocab is None else int(adapter.vocab.size),
        vocab_coverage=None if adapter.vocab is None else coverage(held_ex, adapter.vocab),
        kind=adapter.kind,
        second=getattr(result, "second", None),
    )
    report.draft_share = (
        head_share(target.model, report.draft_vocab)
        if is_head
        else weight_share(target.model, layer, report.draft_vocab)
    )
    meta = {
        "kind": adapter.kind,
        "layer": adapter.layer,
        "agreement": result.after,
        "vocab_size": report.draft_vocab,
    }
    report.draft_length, report.speedup = promise(target, meta, verify_cost)
    if store:
        meta = {
            "agreement": result.after,
            "early_exit_agreement": early,
            "tokens": result.tokens,
            "curve": result.curve,
            "held_out_positions": report.held_out_positions,
        }
        if is_head:
            meta["second"] = report.second
        report.path = str(save(target, adapter, meta))
    return report


@dataclass
class _HeadResult:
    """`train_head`'s report in `adapter.TrainResult`'s terms (agreement: the first draft
    token; `second`: the second)."""

    before: float
    after: float
    kl_before: float
    kl_after: float
    tokens: int
    curve: list[tuple[int, float]]
    second: float


def _train_head(target, adapter, train_ex, train_f, held_ex, held_f, cfg, stepped) -> _HeadResult:
    r = train_head(
        target.model,
        adapter.block,
        head_examples(train_ex, train_f),
        head_examples(held_ex, held_f),
        tokens=cfg.tokens,
        lr=cfg.lr,
        eval_every=cfg.eval_every,
        seed=cfg.seed,
        on_step=lambda n, _loss: stepped(n),
        vocab=adapter.vocab,
    )
    return _HeadResult(
        before=r["before"],
        after=r["after"],
        kl_before=r["kl_before"],
        kl_after=r["kl_after"],
        tokens=r["tokens"],
        curve=[(seen, a1) for seen, a1, _ in r["curve"]],
        second=r["after_second"],
    )
