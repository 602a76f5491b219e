"""What a finished request returns: its answers (`n` of them), text, finish reason, token
counts, drafting statistics and timings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .sequence import Sequence


@dataclass
class Choice:
    """One answer: its tokens (EOS and a stop sequence excluded), text, why it ended, and
    per token (when asked) {"token", "id", "logprob", "top_logprobs": [...]}."""

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length" | "cancelled"
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


@dataclass
class Group:
    """The `n` answers of one request."""

    n: int
    seqs: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)


def completed(done: list[Sequence]) -> list[list[Sequence]]:
    """The requests that `done` (rows that just finished) completes: each request's rows, once
    all its `n` answers have finished."""
    out = []
    for s in done:
        if s.group is not None:
            s.group.finished.append(s)
            if len(s.group.finished) < len(s.group.seqs):
                continue  # the request's other answers are still running
            out.append(s.group.seqs)
        else:
            out.append([s])
    return out


def result(seqs: list[Sequence], decode, learner=None) -> GenerationResult:
    """One request's result from its finished rows (`decode`: token ids -> text); with the
    self-drafter's online `learner`, the version serving as the request ended."""
    choices = []
    for s in seqs:
        text = decode(s.output)
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
    if learner is not None:
        speculative["adapter_version"] = learner.version
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
