"""Training and evaluating an early-exit adapter against the frozen target.

Loss: KL(full || draft) over the whole vocabulary at the answer positions (the teacher is
the target's own next-token distribution there, not just its sampled token). Adam with a
linear warmup then cosine decay (the finding: lr 1e-3). Seeded: the same data, seed and
settings give the same adapter.

Evaluation: top-1 agreement with the full model on held-out examples, the share of
positions where the draft's argmax is the target's argmax (what a greedy row accepts per
token, before the chain effect).

An adapter with a reduced vocabulary is trained and measured through it: the teacher is the
target's distribution renormalized over those tokens (both heads then cost Vr / V of the
whole one), and a position whose target token lies outside them counts as a disagreement.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from core.engine.adapters.block import Adapter, draft_hidden, reduced_logits
from core.engine.cache import bucket, bucket_rows, kv_pad
from core.engine.scorer import head

from .data import Features


@dataclass
class TrainConfig:
    """Training settings.

    Attributes:
        tokens: answer positions to train on in all (epochs over the data until reached).
        lr: peak learning rate.
        warmup: share of the steps spent warming up linearly.
        batch_tokens: padded tokens per step.
        eval_every: answer positions between learning-curve points (0 = start and end only).
        seed: shuffling seed.
    """

    tokens: int = 60_000
    lr: float = 1e-3
    warmup: float = 0.05
    batch_tokens: int = 1024
    eval_every: int = 10_000
    seed: int = 0


@dataclass
class TrainResult:
    """What training measured.

    Attributes:
        before: held-out agreement of the untrained adapter.
        after: held-out agreement once trained.
        kl_before / kl_after: held-out mean KL(full || draft) in nats.
        curve: [(training positions seen, held-out agreement)], from 0.
        losses: training loss per step.
        tokens: training positions seen.
    """

    before: float
    after: float
    kl_before: float
    kl_after: float
    curve: list[tuple[int, float]] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    tokens: int = 0


def pad_exits(items: list, pad: int | None = None) -> tuple[mx.array, mx.array]:
    """Right-padded (B, T, D) exit states of `items` (each with `.exit` (T, D), `.start` and
    `.n`) and the (M,) flat indices in (B * T) of their `n` positions from `start`.

    With `pad` > 1 (default `cache.kv_pad()`: 64 on CUDA, else 0) T is a multiple of `pad`
    and B a power of two (zero rows after the real ones): training and evaluation steps then
    meet a few shapes instead of building attention graphs for a new one every step. Right
    padding leaves the real positions' causal attention as it was."""
    pad = kv_pad() if pad is None else pad
    T = bucket(max(f.exit.shape[0] for f in items), pad)
    D = items[0].exit.shape[1]
    xs, flat = [], []
    for r, f in enumerate(items):
        x = f.exit
        if x.shape[0] < T:
            x = mx.concatenate([x, mx.zeros((T - x.shape[0], D), x.dtype)])
        xs.append(x)
        flat.append(r * T + f.start + np.arange(f.n))
    xs += [mx.zeros((T, D), xs[0].dtype)] * (bucket_rows(len(items), pad) - len(items))
    return mx.stack(xs), mx.array(np.concatenate(flat).astype(np.int32))


def _batch(feats: list[Features]) -> tuple[mx.array, mx.array, mx.array]:
    """Right-padded (B, T, D) exit states, the (M, D) final states at the answer positions
    and the (M,) flat indices of those positions in (B * T)."""
    x, idx = pad_exits(feats)
    return x, mx.concatenate([f.final for f in feats]), idx


def _logits(model: nn.Module, adapter: Adapter, x: mx.array, idx: mx.array) -> mx.array:
    """(B, T, D) exit states -> (M, V or Vr) draft logits at the flat positions `idx`."""
    h = draft_hidden(adapter, x)
    return _head(model, adapter, h.reshape(-1, h.shape[-1])[idx])


def _head(model: nn.Module, adapter: Adapter | None, h: mx.array) -> mx.array:
    """The whole head, or the adapter's reduced one."""
    if adapter is None or adapter.vocab is None:
        return head(model, h)
    return reduced_logits(model, adapter, h)


def _kl(teacher: mx.array, student: mx.array) -> mx.array:
    """(M, V) logits each -> (M,) KL(teacher || student) in nats."""
    teacher, student = teacher.astype(mx.float32), student.astype(mx.float32)
    t = teacher - mx.logsumexp(teacher, axis=-1, keepdims=True)
    s = student - mx.logsumexp(student, axis=-1, keepdims=True)
    return (mx.exp(t) * (t - s)).sum(-1)


def _top1(model: nn.Module, feats: list[Features]) -> None:
    """Each example's target tokens (the whole head's argmax), computed once."""
    for f in feats:
        if f.top1 is None:
            f.top1 = head(model, f.final).argmax(-1)
            mx.eval(f.top1)


def evaluate(
    model: nn.Module, adapter: Adapter | None, feats: list[Features], batch_tokens: int = 2048
) -> tuple[float, float]:
    """(top-1 agreement, mean KL) of the draft with the full model on `feats`. With no
    adapter: plain early exit at the features' layer (norm + head on the exit states)."""
    _top1(model, feats)
    agree, kl, n = 0.0, 0.0, 0
    for group in _chunks(feats, batch_tokens):
        x, final, idx = _batch(group)
        want = mx.concatenate([f.top1 for f in group])
        teacher = _head(model, adapter, final)
        if adapter is None:
            student = head(model, x.reshape(-1, x.shape[-1])[idx])
        else:
            student = _logits(model, adapter, x, idx)
        drafted = student.argmax(-1)
        if adapter is not None and adapter.vocab is not None:
            drafted = adapter.vocab[drafted]
        a = (want == drafted).sum()
        k = _kl(teacher, student).sum()
        mx.eval(a, k)
        agree += a.item()
        kl += k.item()
        n += final.shape[0]
    return (agree / n, kl / n) if n else (0.0, 0.0)


def _chunks(feats: list[Features], batch_tokens: int) -> list[list[Features]]:
    out, cur, longest = [], [], 0
    for f in feats:
        longest2 = max(longest, f.exit.shape[0])
        if cur and longest2 * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, longest2 = [], f.exit.shape[0]
        cur.append(f)
        longest = longest2
    if cur:
        out.append(cur)
    return out


def warmup_cosine(lr: float, steps: int, warm: int):
    """The learning rate over `steps`: linear from lr / 100 to `lr` over `warm` steps, then
    cosine decay."""
    return optim.join_schedules(
        [optim.linear_schedule(lr * 0.01, lr, warm), optim.cosine_decay(lr, max(1, steps - warm))],
        [warm],
    )


def train(
    model: nn.Module,
    adapter: Adapter,
    train_feats: list[Features],
    held_feats: list[Features],
    config: TrainConfig | None = None,
    on_step: Callable[[int], None] | None = None,
) -> TrainResult:
    """Train `adapter` in place on `train_feats`; measure it on `held_feats` before, at
    every `eval_every` positions and after. `on_step(positions)` after each step.

    The block trains in float32 whatever the target runs in (a GPU target keeps float16
    activations: Adam's moments underflow or overflow there and the weights go non-finite)
    and returns to the target's dtype before the final measurement."""
    cfg = config or TrainConfig()
    if not train_feats:
        raise ValueError("no training examples")
    rng = np.random.default_rng(cfg.seed)
    mx.random.seed(cfg.seed)
    per_epoch = sum(f.n for f in train_feats)
    steps_per_epoch = len(_chunks(train_feats, cfg.batch_tokens))
    steps = max(1, round(cfg.tokens / per_epoch * steps_per_epoch))
    opt = optim.Adam(learning_rate=warmup_cosine(cfg.lr, steps, max(1, int(cfg.warmup * steps))))

    def loss_fn(x, final, idx):
        teacher = mx.stop_gradient(_head(model, adapter, final))
        return _kl(teacher, _logits(model, adapter, x.astype(mx.float32), idx)).mean()

    step_fn = nn.value_and_grad(adapter.block, loss_fn)
    before, kl_before = evaluate(model, adapter, held_feats)
    serving = model.model.norm.weight.dtype
    adapter.block.set_dtype(mx.float32)
    result = TrainResult(before, before, kl_before, kl_before, curve=[(0, before)])
    seen, next_eval, step = 0, cfg.eval_every, 0
    while step < steps:
        order = rng.permutation(len(train_feats))
        # Shuffled, then grouped by length within windows so padding stays small.
        window = 64
        shuffled = [train_feats[i] for i in order]
        for w in range(0, len(shuffled), window):
            part = sorted(shuffled[w : w + window], key=lambda f: f.exit.shape[0])
            groups = _chunks(part, cfg.batch_tokens)
            for g in (groups[i] for i in rng.permutation(len(groups))):
                if step >= steps:
                    break
                x, final, idx = _batch(g)
                loss, grads = step_fn(x, final, idx)
                opt.update(adapter.block, grads)
                mx.eval(adapter.block.parameters(), opt.state, loss)
                result.losses.append(loss.item())
                seen += final.shape[0]
                step += 1
                if on_step is not None:
                    on_step(final.shape[0])
                if cfg.eval_every and seen >= next_eval and step < steps:
                    result.curve.append((seen, evaluate(model, adapter, held_feats)[0]))
                    next_eval += cfg.eval_every
    adapter.block.set_dtype(serving)
    result.after, result.kl_after = evaluate(model, adapter, held_feats)
    result.curve.append((seen, result.after))
    result.tokens = seen
    return result
