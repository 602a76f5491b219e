"""Training data for self-drafters: the target's own answers to a workload's prompts.

The target answers every prompt (greedy, and optionally sampled answers for the training
prompts: the finding's sampled answers raised held-out agreement), batched through the
engine with no drafting. Each (prompt, answer) pair is then run once through the frozen
target to keep what training and evaluation need per sequence: the hidden states at the
exit layer for every position, and the last layer's hidden states at the answer positions
(the teacher's logits are recomputed from them by the head, far cheaper than the layers).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from core.engine.adapters.block import prefix_hidden
from core.engine.sampling import GenerationParams
from core.models import LoadedModel


@dataclass
class Example:
    """One sequence the target produced: the prompt's ids and its answer's ids."""

    prompt: list[int]
    answer: list[int]

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.answer

    @property
    def positions(self) -> range:
        """Positions whose next-token distribution a drafter must match: after the prompt's
        last token through after the answer's last token."""
        return range(len(self.prompt) - 1, len(self.prompt) + len(self.answer))


@dataclass
class Features:
    """One example through the frozen target.

    Attributes:
        exit: (T, D) hidden states at the exit layer, every position.
        final: (P, D) the last layer's hidden states at the answer positions.
        start: the first answer position (positions are start .. start + P - 1).
    """

    exit: mx.array  # (T, D)
    final: mx.array  # (P, D)
    start: int
    top1: mx.array | None = None  # (P,) the target's token at each position, once computed

    @property
    def n(self) -> int:
        return self.final.shape[0]


def split(prompts: list, held_out: float, seed: int = 0) -> tuple[list, list]:
    """Distinct prompts into (train, held-out), by a seeded hash of their content: the same
    prompt always lands on the same side, duplicates never on both."""
    distinct: dict[str, object] = {}
    for p in prompts:
        distinct.setdefault(repr(p), p)
    keyed = sorted(
        distinct.items(),
        key=lambda kv: hashlib.sha256(f"{seed}:{kv[0]}".encode()).hexdigest(),
    )
    n_held = max(1, round(held_out * len(keyed))) if held_out > 0 and len(keyed) > 1 else 0
    held = [p for _, p in keyed[:n_held]]
    train = [p for _, p in keyed[n_held:]]
    return train, held


def answer(
    target: LoadedModel,
    prompts: list[list[int]],
    max_tokens: int | list[int],
    samples: int = 0,
    temperature: float = 0.7,
    seed: int = 0,
    on_result: Callable[[int], None] | None = None,
) -> list[Example]:
    """The target's greedy answer to every prompt, then `samples` sampled answers each
    (seeded), batched with no drafting; `max_tokens` for all or per prompt.
    `on_result(tokens)` after each answer."""
    from core.engine import Engine

    caps = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    reqs = [(p, GenerationParams(max_tokens=m)) for p, m in zip(prompts, caps, strict=True)]
    for j in range(samples):
        reqs += [
            (p, GenerationParams(max_tokens=m, temperature=temperature, seed=seed + j))
            for p, m in zip(prompts, caps, strict=True)
        ]
    engine = Engine(target, draft="none")
    done = None if on_result is None else (lambda r: on_result(len(r.tokens)))
    results = engine.generate_many(reqs, on_result=done)
    return [Example(list(p), r.tokens) for (p, _), r in zip(reqs, results, strict=True)]


def top_tokens(examples: list[Example], n: int, always: set[int] = frozenset()) -> mx.array:
    """(Vr,) int32 sorted: the `n` tokens the answers hold most (ties: lower id first),
    plus `always` (the EOS tokens a row drafts at its end)."""
    counts: dict[int, int] = {}
    for e in examples:
        for t in e.answer:
            counts[t] = counts.get(t, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    keep = set(ranked[: max(0, n - len(always))]) | set(always)
    return mx.array(sorted(keep), dtype=mx.int32)


def coverage(examples: list[Example], vocab: mx.array) -> float:
    """The share of the examples' answer tokens that `vocab` (a draft vocabulary) holds."""
    keep = set(vocab.tolist())
    tokens = [t for e in examples for t in e.answer]
    return sum(t in keep for t in tokens) / max(len(tokens), 1)


def answer_cached(
    path: Path | None, key: dict, make: Callable[[], list[Example]]
) -> tuple[list[Example], bool]:
    """`make()`'s examples, kept in a JSON file at `path` under `key` (what they were made
    from: model, prompts, settings) and reused while the key matches; (examples, reused)."""
    if path is not None and path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return [Example(p, a) for p, a in data["examples"]], True
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or stale: answered again
    examples = make()
    if path is not None:
        body = {"key": key, "examples": [[e.prompt, e.answer] for e in examples]}
        path.write_text(json.dumps(body))
    return examples, False


def features(
    target: LoadedModel,
    examples: list[Example],
    layer: int,
    batch_tokens: int = 2048,
    on_batch: Callable[[int], None] | None = None,
) -> list[Features]:
    """Every example once through the frozen target (batched by length, right-padded)."""
    model = target.model
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].tokens))
    out: list[Features | None] = [None] * len(examples)
    for group in _groups(order, [len(e.tokens) for e in examples], batch_tokens):
        T = max(len(examples[i].tokens) for i in group)
        ids = np.zeros((len(group), T), np.int32)
        for r, i in enumerate(group):
            t = examples[i].tokens
            ids[r, : len(t)] = t
        h_exit, h_last = prefix_hidden(model, mx.array(ids), layer)  # (B, T, D) each
        for r, i in enumerate(group):
            e = examples[i]
            pos = e.positions
            f = Features(h_exit[r, : len(e.tokens)], h_last[r, pos.start : pos.stop], pos.start)
            out[i] = f
        mx.eval([(out[i].exit, out[i].final) for i in group])
        if on_batch is not None:
            on_batch(sum(examples[i].positions.stop - examples[i].positions.start for i in group))
    return out  # type: ignore[return-value]


def features_cached(
    path: Path | None, key: dict, make: Callable[[], list[Features]]
) -> tuple[list[Features], bool]:
    """`make()`'s features, kept in a safetensors file at `path` under `key` and reused
    while the key matches (a full forward over every sequence: the other costly part of a
    calibration); (features, reused)."""
    tag = json.dumps(key, sort_keys=True)
    if path is not None and path.exists():
        try:
            arrays, meta = mx.load(str(path), return_metadata=True)
            if meta.get("key") == tag:
                n = int(meta["n"])
                starts = arrays["starts"].tolist()
                return [
                    Features(arrays[f"exit.{i}"], arrays[f"final.{i}"], starts[i]) for i in range(n)
                ], True
        except (OSError, ValueError, KeyError, RuntimeError):
            pass  # unreadable or stale: computed again
    feats = make()
    if path is not None:
        arrays = {f"exit.{i}": f.exit for i, f in enumerate(feats)}
        arrays.update({f"final.{i}": f.final for i, f in enumerate(feats)})
        arrays["starts"] = mx.array([f.start for f in feats], dtype=mx.int32)
        mx.save_safetensors(str(path), arrays, metadata={"key": tag, "n": str(len(feats))})
    return feats, False


def _groups(order: list[int], lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Consecutive indices of `order` in groups of at most `batch_tokens` padded tokens."""
    groups, cur, longest = [], [], 0
    for i in order:
        longest2 = max(longest, lengths[i])
        if cur and longest2 * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, longest2 = [], lengths[i]
        cur.append(i)
        longest = longest2
    if cur:
        groups.append(cur)
    return groups
