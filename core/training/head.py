"""Training the feature head (core/engine/adapters/head.py) and measuring it.

Trained like the early-exit adapter (`adapter.py`): KL(full || draft) against the target's
own next-token distribution at the answer positions, from the features `data.py` keeps
(the last layer's hidden states at every answer position) and the answer tokens.

Measured here: teacher-forced top-1 agreement (the first draft token after a verify step,
where the head reads the target's true state) and the second token's (the head reads its
own prediction of the state, the token being the one the target chose).
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np

from core.engine.adapters.block import vocab_rows
from core.engine.adapters.head import FeatureHead
from core.engine.scorer import head

from .adapter import _kl, warmup_cosine
from .data import Example, Features


@dataclass
class HeadExample:
    """One answer as the head sees it: the target's states at p, the tokens x_{p+1} and the
    states at p + 1 (the teacher), for every answer position but the last."""

    h: mx.array  # (N, D)
    tokens: mx.array  # (N,)
    teacher: mx.array  # (N, D)

    @property
    def n(self) -> int:
        return self.h.shape[0]


def head_examples(examples: list[Example], feats: list[Features]) -> list[HeadExample]:
    """Pairs for the head from the examples and their features (answers of 2+ positions)."""
    out = []
    for e, f in zip(examples, feats, strict=True):
        n = f.n - 1
        if n < 1:
            continue
        toks = mx.array(e.tokens[f.start + 1 : f.start + 1 + n], dtype=mx.int32)
        out.append(HeadExample(f.final[:n], toks, f.final[1 : n + 1]))
    return out


def _batch(exs: list[HeadExample]) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """Right-padded (B, T, D) states, (B, T) tokens, the (M, D) teacher states and the (M,)
    flat indices of the real positions in (B * T)."""
    T = max(x.n for x in exs)
    D = exs[0].h.shape[1]
    hs, ts, flat = [], [], []
    for r, x in enumerate(exs):
        pad = T - x.n
        hs.append(mx.concatenate([x.h, mx.zeros((pad, D), x.h.dtype)]) if pad else x.h)
        ts.append(mx.concatenate([x.tokens, mx.zeros((pad,), mx.int32)]) if pad else x.tokens)
        flat.append(r * T + np.arange(x.n))
    teacher = mx.concatenate([x.teacher for x in exs])
    idx = mx.array(np.concatenate(flat).astype(np.int32))
    return mx.stack(hs), mx.stack(ts), teacher, idx


def _mask(h: mx.array):
    """Causal attention over a sequence (none for one position)."""
    return "causal" if h.shape[1] > 1 else None


def _flat(a: mx.array, idx: mx.array) -> mx.array:
    return a.reshape(-1, a.shape[-1])[idx]


def scorer(model: nn.Module, vocab: mx.array | None = None):
    """(..., D) states -> (..., V) logits through the target's norm and head, or with a
    reduced draft vocabulary (Vr,) -> (..., Vr) logits of those tokens only."""
    if vocab is None:
        return lambda h: head(model, h)
    rows = vocab_rows(model, vocab)  # (Vr, D)
    return lambda h: model.model.norm(h) @ rows.T


def evaluate(
    model: nn.Module,
    head_: FeatureHead,
    exs: list[HeadExample],
    batch: int = 16,
    vocab: mx.array | None = None,
) -> tuple[float, float, float]:
    """(first-token agreement, second-token agreement, mean KL of the first) on `exs`.

    The second token: the head reads its own predicted state (of the first pass) in place
    of the target's, with the target's tokens (a row whose first draft token was accepted).
    With a reduced draft vocabulary `vocab`, the head drafts only its tokens (a target
    token outside them is a disagreement) and the KL is against the target's distribution
    renormalized over them.
    """
    score = scorer(model, vocab)

    def drafted(logits: mx.array) -> mx.array:
        top = logits.argmax(-1)
        return top if vocab is None else vocab[top]

    agree1 = agree2 = kl = 0.0
    n1 = n2 = 0
    for i in range(0, len(exs), batch):
        group = exs[i : i + batch]
        h, toks, teacher, idx = _batch(group)
        mask = _mask(h)
        pred = head_(model, h, toks, mask)  # (B, T, D): states at p + 1
        want = head(model, teacher).argmax(-1)  # (M,) the target's tokens
        s1 = score(_flat(pred, idx))
        a1 = (drafted(s1) == want).sum()
        k1 = _kl(score(teacher), s1).sum()
        # Second token: position j reads the predicted state for j (made at j - 1).
        shifted = mx.concatenate([h[:, :1], pred[:, :-1]], axis=1)
        pred2 = head_(model, shifted, toks, mask)
        valid = np.concatenate([r * h.shape[1] + np.arange(1, x.n) for r, x in enumerate(group)])
        pos = mx.array(valid.astype(np.int32))
        starts = np.cumsum([0] + [x.n for x in group[:-1]])  # each example's first in `want`
        keep = mx.array(
            np.concatenate(
                [s + np.arange(1, x.n) for s, x in zip(starts, group, strict=True)]
            ).astype(np.int32)
        )
        a2 = (drafted(score(_flat(pred2, pos))) == want[keep]).sum()
        mx.eval(a1, k1, a2)
        agree1 += a1.item()
        kl += k1.item()
        agree2 += a2.item()
        n1 += teacher.shape[0]
        n2 += int(valid.size)
    return (agree1 / max(n1, 1), agree2 / max(n2, 1), kl / max(n1, 1))


def train_head(
    model: nn.Module,
    head_: FeatureHead,
    train_exs: list[HeadExample],
    held_exs: list[HeadExample],
    tokens: int = 60_000,
    lr: float = 1e-3,
    batch: int = 16,
    feature_weight: float = 0.1,
    eval_every: int = 10_000,
    seed: int = 0,
    on_step=None,
    vocab: mx.array | None = None,
) -> dict:
    """Train `head_` in place: KL(full || draft) + `feature_weight` x smooth-L1 between the
    predicted and the target's normalized states (EAGLE's regression, which keeps the
    chain's fed-back states close to real ones). Returns before / after agreements (first
    and second token), KL and the learning curve [(positions seen, first, second)].

    With a reduced draft vocabulary `vocab` (Vr,), both distributions are over its tokens
    (the target's renormalized): each step's heads cost Vr / V of the whole one's.

    Like the early-exit adapter (`adapter.train`), the head trains in float32 whatever the
    target runs in (on a float16 GPU target Adam's moments go non-finite) and returns to the
    target's dtype before the final measurement."""
    if not train_exs:
        raise ValueError("no training examples")
    rng = np.random.default_rng(seed)
    mx.random.seed(seed)
    per_step = max(1, sum(x.n for x in train_exs) * batch // len(train_exs))
    steps = max(1, tokens // per_step)
    opt = optim.Adam(learning_rate=warmup_cosine(lr, steps, max(1, steps // 20)))
    norm = model.model.norm
    score = scorer(model, vocab)

    def loss_fn(h, toks, teacher, idx):
        mask = _mask(h)
        pred = _flat(head_(model, h, toks, mask), idx)
        t_logits = mx.stop_gradient(score(teacher))
        loss = _kl(t_logits, score(pred)).mean()
        if feature_weight:
            diff = norm(pred) - mx.stop_gradient(norm(teacher))
            loss = loss + feature_weight * nn.losses.smooth_l1_loss(diff, mx.zeros_like(diff))
        return loss

    step_fn = nn.value_and_grad(head_, loss_fn)
    b1, b2, kb = evaluate(model, head_, held_exs, vocab=vocab)
    serving = norm.weight.dtype
    head_.set_dtype(mx.float32)
    out = {"before": b1, "before_second": b2, "kl_before": kb, "curve": [(0, b1, b2)]}
    seen, next_eval, step = 0, eval_every, 0
    while step < steps:
        order = rng.permutation(len(train_exs))
        for i in range(0, len(order), batch):
            if step >= steps:
                break
            group = sorted((train_exs[j] for j in order[i : i + batch]), key=lambda x: x.n)
            h, toks, teacher, idx = _batch(group)
            loss, grads = step_fn(h.astype(mx.float32), toks, teacher, idx)
            opt.update(head_, grads)
            mx.eval(head_.parameters(), opt.state, loss)
            seen += teacher.shape[0]
            step += 1
            if on_step is not None:
                on_step(teacher.shape[0], loss.item())
            if eval_every and seen >= next_eval and step < steps:
                a1, a2, _ = evaluate(model, head_, held_exs, vocab=vocab)
                out["curve"].append((seen, a1, a2))
                next_eval += eval_every
    head_.set_dtype(serving)
    a1, a2, ka = evaluate(model, head_, held_exs, vocab=vocab)
    out.update(after=a1, after_second=a2, kl_after=ka, tokens=seen)
    out["curve"].append((seen, a1, a2))
    return out
