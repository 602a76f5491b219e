"""Online learning: the serving self-drafter (an early-exit adapter or the feature head)
improves while a job runs.

Every finished row hands the learner its prompt and answer: the target's own output on
exactly the job's distribution, free to collect. Between batch steps, within a bounded
share of wall time (`share`), the learner does one unit of work at a time:

- new examples run once through the target: its first L layers (an adapter's exit states),
  or all of them (the feature head's pairs: the last layer's state at each answer position
  and the token chosen after it, as `head.head_examples` pairs them), unless the engine
  hands over those states with the row (its head drafter kept what the verify steps
  computed: no forward at all);
- a *candidate* copy of the serving block trains on them, one minibatch per turn, with the
  answer's tokens as targets (cross-entropy; a greedy answer's tokens are the target's
  argmax, what a greedy row accepts; a sampled answer's are draws from the target's
  distribution, whose expected gradient is the KL's), scored over the tokens the training
  answers hold (the head is most of a step's cost; the answer's token is always there);
- every `eval_every` steps the candidate and the serving block are measured on the same
  held-out slice of the job (the rows of one prompt in `held_every`, by a hash of the
  prompt, so a prompt the job repeats is never on both sides; never trained on) and the
  candidate's weights replace the serving block's only when it agrees with the target on
  more held-out positions. A worse version is never swapped in.

The target stays frozen and only the drafter's weights change between steps, so output
stays lossless: the verify step decides every token. `version` counts the swaps; `history`
records every evaluation (what a user sees climb). The engine builds its learner through
`learner_factory` and drives it through core/engine/learner.py's `Learner` protocol. (A feature head's rows in flight keep the
keys and values their head cache took under the version before; rows admitted after a swap
draft wholly with the new one.)
"""

from __future__ import annotations

import time
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten

from core.engine.adapters.block import Adapter, clone, draft_hidden, exit_hidden, prefix_hidden
from core.engine.adapters.head import KIND as HEAD
from core.engine.cache import bucket, bucket_rows, kv_pad

from .adapter import _chunks, _head, pad_exits

SHARE = 0.10  # the default bound on the share of wall time spent learning


def learner_factory(share: float) -> Callable[[nn.Module, Adapter], OnlineLearner] | None:
    """The engine's `learner` for a share of wall time (`Engine(learner=...)`): an
    `OnlineLearner` at that share for whichever adapter serves; None at 0 (no online learning).

    Raises:
        ValueError: when `share` is outside [0, 1].
    """
    if not 0 <= share <= 1:
        raise ValueError(f"the learning share must be between 0 and 1, got {share}")
    return partial(OnlineLearner, share=share) if share > 0 else None


@dataclass
class Sample:
    """One finished row, ready to train on: the drafter's input states and the answer it
    gave."""

    exit: mx.array  # (T, D): the input of layer L at every position but the last (adapter),
    # or the last layer's states at the answer's positions but its last (feature head)
    start: int  # the position whose next token is the first target
    targets: mx.array  # (A,) int32: the answer's tokens (a feature head: from its second on)
    tokens: mx.array | None = None  # (T,) int32 the token after each state (feature head)

    @property
    def n(self) -> int:
        return self.targets.size


class OnlineLearner:
    """Trains the serving adapter of an engine on the rows it finishes (module docstring).

    Args:
        model: the frozen target (an mlx-lm model).
        adapter: the serving adapter; its block's weights are replaced on each swap.
        share: at most this share of the wall time since the first row finished is spent
            here (one unit of work may overshoot it by that unit).
        held_every: one prompt in n (by a hash of its tokens) is held out for evaluation.
        held_max / buffer_tokens: the held-out rows kept (the latest) and the tokens of
            training rows kept (the oldest dropped first).
        batch_tokens: padded tokens per training minibatch.
        eval_every: training steps between evaluations.
        clock: seconds (injectable for tests).
    """

    def __init__(
        self,
        model: nn.Module,
        adapter: Adapter,
        share: float = SHARE,
        held_every: int = 5,
        held_max: int = 24,
        buffer_tokens: int = 65_536,
        batch_tokens: int = 1024,
        lr: float = 1e-3,
        warmup: int = 5,
        eval_every: int = 10,
        seed: int = 0,
        clock: Callable[[], float] = time.perf_counter,
    ):
        if not 0 < share <= 1:
            raise ValueError(f"the learning share must be in (0, 1], got {share}")
        self.model, self.serving = model, adapter
        self.candidate = clone(adapter)
        # Trained in float32 whatever the target runs in (a GPU keeps float16 activations:
        # Adam's second moments underflow there and nothing is learned); cast back on a swap.
        self.candidate.block.set_dtype(mx.float32)
        self.share, self.held_every, self.eval_every = share, held_every, eval_every
        self.batch_tokens, self.buffer_tokens, self.clock = batch_tokens, buffer_tokens, clock
        self.version = int(adapter.meta.get("version", 0))
        self.history: list[dict] = []
        self.rows = 0  # finished rows observed
        self.trained = 0  # training positions seen
        self.steps = 0
        self.spent = 0.0  # seconds spent learning
        self._t0: float | None = None
        # Rows not yet featurized: (prompt, answer, held out, the feature head's states or None)
        self._new: deque[tuple[list[int], list[int], bool, list | None]] = deque()
        self._train: deque[Sample] = deque()
        self._held: deque[Sample] = deque(maxlen=held_max)
        self._rng = np.random.default_rng(seed)
        schedule = optim.join_schedules(
            [optim.linear_schedule(lr * 0.01, lr, warmup), lambda _: lr], [warmup]
        )
        self._opt = optim.Adam(learning_rate=schedule)
        self._step = nn.value_and_grad(self.candidate.block, self._loss)
        # The loss scores the answers' own tokens only (those any training answer holds, or
        # a reduced-vocabulary adapter's): the head is most of a step's cost, and the
        # target's token is always among them. Evaluation drafts with the whole head.
        self._tokens: set[int] = set()
        self._view: tuple[Adapter, np.ndarray] | None = None  # (candidate over them, index)
        # Shapes rounded up where the backend builds a graph per exact shape (CUDA attention,
        # as the cache pads its reads): unrounded, every unit of work met a new shape.
        self.pad = kv_pad()

    # -- what the engine calls ----------------------------------------------------------

    def observe(self, prompt: list[int], answer: list[int], states: list | None = None) -> None:
        """A finished row: its prompt and the tokens it emitted; for a feature head, the
        target's last-layer states (n, D each) at the positions before each of them when the
        engine kept them (else a forward computes them)."""
        if not answer or not prompt:
            return
        if self._t0 is None:
            self._t0 = self.clock()
        self.rows += 1
        # Held out by prompt: a prompt the job repeats lands on the same side every time.
        held = zlib.crc32(np.asarray(prompt, np.int32).tobytes()) % self.held_every == 0
        head = self.serving.kind == HEAD
        if not head or states is None or sum(h.shape[0] for h in states) != len(answer):
            states = None
        self._new.append((list(prompt), list(answer), held, states))

    def tick(self) -> bool:
        """One unit of work when the time budget allows; whether it did one."""
        if self._t0 is None or self.spent > self.share * (self.clock() - self._t0):
            return False
        t = self.clock()
        try:
            return self.work()
        finally:
            self.spent += self.clock() - t

    def work(self) -> bool:
        """One unit of work regardless of the budget: featurize new rows, else a training
        step (and an evaluation every `eval_every` steps); whether there was any."""
        if self._new:
            self._featurize()
            return True
        if not self._train:
            return False
        self._train_step()
        if self.steps % self.eval_every == 0 and self._held:
            self.evaluate()
        return True

    def evaluate(self) -> dict:
        """Candidate against serving on the held-out rows; swaps when the candidate agrees
        with the target on more positions. The history entry."""
        held = list(self._held)
        cand, serving = self.agreement(self.candidate, held), self.agreement(self.serving, held)
        swapped = cand > serving
        if swapped:
            dtypes = {k: v.dtype for k, v in tree_flatten(self.serving.block.parameters())}
            new = [
                (k, v.astype(dtypes[k])) for k, v in tree_flatten(self.candidate.block.parameters())
            ]
            self.serving.block.update(tree_unflatten(new))
            self.version += 1
            self.serving.meta.update(version=self.version, agreement=cand, online=True)
        entry = {
            "rows": self.rows,
            "trained_positions": self.trained,
            "steps": self.steps,
            "held_out_positions": sum(s.n for s in held),
            "candidate": round(cand, 4),
            "serving": round(cand if swapped else serving, 4),
            "was_serving": round(serving, 4),
            "version": self.version,
            "swapped": swapped,
            "spent_s": round(self.spent, 3),
        }
        self.history.append(entry)
        return entry

    def agreement(self, adapter: Adapter, samples: list[Sample]) -> float:
        """The share of `samples`' answer positions where `adapter` drafts the answer's token."""
        agree = n = 0
        for group in _chunks(samples, self.batch_tokens * 2):
            x, idx, y, toks = self._pack(group)
            drafted = _head(self.model, adapter, self._hidden(adapter, x, idx, toks)).argmax(-1)
            if adapter.vocab is not None:
                drafted = adapter.vocab[drafted]
            hits = (drafted == y).sum()  # padded positions (y = -1) never match
            mx.eval(hits)
            agree += hits.item()
            n += sum(s.n for s in group)
        return agree / n if n else 0.0

    def stats(self) -> dict:
        """What a job's metrics show: version, rows, positions trained, time spent and the
        latest held-out agreement."""
        last = self.history[-1] if self.history else {}
        return {
            "version": self.version,
            "rows": self.rows,
            "trained_positions": self.trained,
            "spent_s": round(self.spent, 3),
            "held_out_agreement": last.get("serving"),
        }

    # -- internals ------------------------------------------------------------------------

    def _featurize(self) -> None:
        """The oldest new rows (up to a minibatch of tokens) through the first L layers."""
        head = self.serving.kind == HEAD
        if self._new[0][3] is not None:  # a feature head's pairs, kept by the engine
            p, a, held, states = self._new.popleft()
            batch, h, at = [(p, a, held)], mx.concatenate(states)[None], [0]
        else:
            batch = [self._new.popleft()[:3]]
            while (
                self._new
                and self._new[0][3] is None
                and _padded(batch + [self._new[0][:3]]) <= self.batch_tokens * 2
            ):
                batch.append(self._new.popleft()[:3])
            T = bucket(max(len(p) + len(a) - 1 for p, a, _ in batch), self.pad)
            ids = np.zeros((bucket_rows(len(batch), self.pad), T), np.int32)
            for r, (p, a, _) in enumerate(batch):
                seq = (p + a)[:-1]  # the last token's next one is not known
                ids[r, : len(seq)] = seq
            if head:  # the last layer's states
                h = prefix_hidden(self.model, mx.array(ids), 1)[1]
            else:
                h = exit_hidden(self.model, mx.array(ids), self.serving.layer)
            at = [len(p) - 1 for p, _, _ in batch]  # the state before the answer's first token
        for r, (p, a, held) in enumerate(batch):
            if head:  # pair i: the state before a[i] and a[i], predicting a[i + 1]
                n = len(a) - 1
                if n < 1:
                    continue
                sample = Sample(
                    h[r, at[r] : at[r] + n],
                    0,
                    mx.array(a[1:], mx.int32),
                    mx.array(a[:n], mx.int32),
                )
            else:
                sample = Sample(h[r, : len(p) + len(a) - 1], len(p) - 1, mx.array(a, mx.int32))
            mx.eval(sample.exit)
            if held:
                self._held.append(sample)
            else:
                self._train.append(sample)
                if not self._tokens.issuperset(a):
                    self._tokens.update(a)
                    self._view = None
        while sum(s.exit.shape[0] for s in self._train) > self.buffer_tokens:
            self._train.popleft()

    def _train_step(self) -> None:
        shuffled = [self._train[i] for i in self._rng.permutation(len(self._train))]
        x, idx, y, toks = self._pack(_chunks(shuffled, self.batch_tokens)[0])
        view, index = self._loss_view()
        real = y >= 0
        y = mx.where(real, mx.array(index)[mx.maximum(y, 0)], -1)  # (M,) -1: not scored
        loss, grads = self._step(view, x, idx, y, toks)
        self._opt.update(self.candidate.block, grads)
        mx.eval(self.candidate.block.parameters(), self._opt.state, loss, real)
        self.steps += 1
        self.trained += int(real.sum().item())

    def _loss_view(self) -> tuple[Adapter, np.ndarray]:
        """The candidate scored over the answers' tokens, and token id -> index there (-1)."""
        if self._view is None:
            V = self.model.model.embed_tokens.weight.shape[0]
            vocab = self.serving.vocab
            head = getattr(self.model, "lm_head", None)
            if vocab is None and head is not None and hasattr(head, "scales"):
                index = np.arange(V, dtype=np.int32)  # a quantized untied head: all of it
            else:
                if vocab is None:
                    vocab = mx.array(sorted(self._tokens), mx.int32)
                index = np.full(V, -1, np.int32)
                index[np.array(vocab)] = np.arange(vocab.size, dtype=np.int32)
            c = self.candidate
            self._view = Adapter(c.kind, c.layer, c.block, c.meta, vocab), index
        return self._view

    def _loss(self, view: Adapter, x, idx, y, toks):
        logits = _head(self.model, view, self._hidden(view, x, idx, toks)).astype(mx.float32)
        keep = y >= 0
        ce = nn.losses.cross_entropy(logits, mx.maximum(y, 0))
        return (ce * keep).sum() / mx.maximum(keep.sum(), 1)

    def _hidden(
        self, adapter: Adapter, x: mx.array, idx: mx.array, toks: mx.array | None = None
    ) -> mx.array:
        """(B, T, D) exit states (with a feature head: the last layer's states, and (B, T)
        the tokens after them) -> (M, D) the drafter's states at the flat positions `idx`."""
        if toks is None:
            h = draft_hidden(adapter, x)
        else:
            h = adapter.block(self.model, x, toks, "causal" if x.shape[1] > 1 else None)
        return h.reshape(-1, h.shape[-1])[idx]

    def _pack(self, samples: list[Sample]):
        """Right-padded (B, T, D) states, the (M,) flat indices of the answer positions,
        their (M,) answer tokens and, for a feature head, the (B, T) tokens after the states
        (else None); with `pad`, M is a multiple of 4 x pad, the padding reading position 0
        with token -1 (never scored, never a match)."""
        x, idx = pad_exits(samples, self.pad)
        y = mx.concatenate([s.targets for s in samples])
        extra = bucket(y.size, 4 * self.pad) - y.size
        if extra:
            idx = mx.concatenate([idx, mx.zeros((extra,), mx.int32)])
            y = mx.concatenate([y, mx.full((extra,), -1, mx.int32)])
        toks = None
        if samples[0].tokens is not None:
            t = np.zeros(x.shape[:2], np.int32)
            for r, s in enumerate(samples):
                t[r, : s.tokens.size] = np.array(s.tokens)
            toks = mx.array(t)
        return x, idx, y, toks


def _padded(rows: list[tuple[list[int], list[int], bool]]) -> int:
    return len(rows) * max(len(p) + len(a) for p, a, *_ in rows)
