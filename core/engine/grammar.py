"""Structured output: `response_format` compiled to a token grammar, and each row's matcher.

A request's `response_format` (`json_object`, or `json_schema` with its schema) is compiled
by llguidance (chosen by measurement: docs/structured-output.md) into a grammar over the
model's tokens; the compiled grammar is cached per process, keyed by the format's canonical
JSON and the tokenizer, so a job of many lines with one schema compiles it once.

Each constrained row holds a `RowGrammar`: a matcher that has consumed the row's output so
far (`advance`, called as tokens are emitted). For a verify step it gives the mask of every
node the target scores (`masks`): the allowed tokens after the row's pending token and after
each draft node, the matcher advanced along the node's path and rolled back, chains and
trees alike. The target's choice at each node is then taken from the masked logits
(`apply_masks`: an additive -inf where a token is not allowed), so a row's output is exactly
plain constrained decoding (mask, then choose), whatever was drafted. Where the grammar
allows one continuation only, `forced` gives it (drafters/forced.py drafts it).

JSON is generated compact, with `", "` and `": "` between items: no free whitespace, so the
model cannot wander in blanks and more of the answer is forced.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
JSON_OBJECT = {"type": "object"}  # `json_object`: any JSON object
# Added to a disallowed token's logit: its probability underflows to exactly 0 in float32,
# so argmax, softmax and the sampling race treat it as -inf, and a log-probability of it
# stays a finite number (JSON has no -inf).
MASKED = -1e30


class GrammarError(ValueError):
    """A `response_format` the grammar engine cannot compile; the message names why."""


@dataclass
class Grammar:
    """A compiled `response_format` for one tokenizer (shared by every row using it)."""

    key: str  # the format's canonical JSON
    grammar: str  # llguidance's grammar text
    tokenizer: Any  # llguidance.LLTokenizer
    words: int  # int32 words per mask: ceil(vocab / 32)

    def row(self) -> RowGrammar:
        """A fresh matcher for one answer."""
        import llguidance

        return RowGrammar(self, llguidance.LLMatcher(self.tokenizer, self.grammar, log_level=0))


class RowGrammar:
    """One answer's grammar state: the matcher has consumed every token of its output.

    Attributes:
        forced_tokens: tokens emitted where the grammar allowed that one only (metrics).
        mask_s: seconds spent computing this row's masks (metrics).
    """

    def __init__(self, grammar: Grammar, matcher: Any):
        self.grammar = grammar
        self.matcher = matcher
        self.forced_tokens = 0
        self.mask_s = 0.0
        # Per token the step emits, in order: whether its mask allowed it alone (set by the
        # engine from the masks of the nodes the row committed).
        self.single: list[bool] = []

    def emitted(self, token: int, j: int) -> None:
        """The row emitted `token`, its step's j-th (the target chose it from the masked
        distribution, so the grammar allows it)."""
        if j < len(self.single) and self.single[j]:
            self.forced_tokens += 1
        if not self.matcher.is_stopped():
            self.matcher.consume_token(token)

    def forced(self, k: int) -> list[int]:
        """Up to `k` tokens the grammar forces next (its one continuation), else []."""
        if k <= 0 or self.matcher.is_stopped():
            return []
        return list(self.matcher.compute_ff_tokens()[:k])

    def masks(self, tokens: list[int], parents: list[int]) -> np.ndarray:
        """(len(tokens), words) int32 bitmasks of the tokens allowed after each node of a
        row's verify segment: node 0 is the pending token (the matcher's own state), node j
        follows `parents[j]` (-1 for node 0). A node the grammar does not allow on its path
        gets every token: the target never chooses it, so nothing reads its choice."""
        t0 = time.perf_counter()
        out = np.full((len(tokens), self.grammar.words), -1, np.int32)
        m = self.matcher
        for j in range(len(tokens)):
            path = []
            p = j
            while p > 0:
                path.append(tokens[p])
                p = parents[p]
            path.reverse()
            took = m.try_consume_tokens(path) if path else 0
            if took == len(path):  # (a complete grammar's mask allows EOS alone)
                row = out[j]
                m.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
            if took:
                m.rollback(took)
        self.mask_s += time.perf_counter() - t0
        return out


def segment_masks(rows: list[tuple[RowGrammar, list[int], list[int]]]) -> list[np.ndarray]:
    """`RowGrammar.masks` of many rows at once: (row, node tokens, parents) -> each row's
    (nodes, W) bitmasks. Chains are computed by llguidance's executor in one call (in
    parallel over rows, the matcher advanced along each draft and rolled back inside it);
    trees row by row."""
    import llguidance.numpy as llnp

    t0 = time.perf_counter()
    chains = [i for i, (_, _, p) in enumerate(rows) if p == list(range(-1, len(p) - 1))]
    out: list[np.ndarray | None] = [None] * len(rows)
    if chains:
        words = rows[chains[0]][0].grammar.words
        total = sum(len(rows[i][1]) for i in chains)
        bits = np.full((total, words), -1, np.int32)  # nodes past a disallowed one: all
        drafted, alone, at = [], [], 0  # (llguidance refuses an empty draft)
        for i in chains:
            g, tokens, _ = rows[i]
            if len(tokens) > 1:
                drafted.append((g.matcher, at, tokens[1:]))
            else:
                alone.append((g.matcher, at))
            out[i] = bits[at : at + len(tokens)]
            at += len(tokens)
        if drafted:
            llnp.fill_next_token_bitmask_par_with_draft_tokens(_executor(), drafted, bits)
        if alone:
            llnp.fill_next_token_bitmask_par(_executor(), alone, bits)
        share = (time.perf_counter() - t0) / len(chains)
        for i in chains:
            rows[i][0].mask_s += share
    for i, (g, tokens, parents) in enumerate(rows):
        if out[i] is None:
            out[i] = g.masks(tokens, parents)
    return out  # type: ignore[return-value]


_executors: list[Any] = []


def _executor() -> Any:
    """llguidance's thread pool for masks, made once per process."""
    import llguidance

    with _lock:
        if not _executors:
            _executors.append(llguidance.LLExecutor())
        return _executors[0]


def apply_masks(logits: mx.array, nodes: list[int], bits: np.ndarray) -> mx.array:
    """(M, V) logits with `MASKED` added wherever `bits` (one row per node in `nodes`)
    disallows a token; other rows unchanged. Bit t of word w allows token 32 * w + t.

    The bits are unpacked on the host (numpy) and added on the device as one (M, V) mask,
    which costs less than an `mx.where` over the logits (docs/structured-output.md)."""
    if not nodes:
        return logits
    M, V = logits.shape
    allowed = np.unpackbits(bits.view(np.uint8), axis=1, bitorder="little")[:, :V]  # (n, <=V)
    if len(nodes) == M and allowed.shape[1] == V and nodes == list(range(M)):
        keep = np.ascontiguousarray(allowed)
    else:
        keep = np.ones((M, V), np.uint8)
        keep[nodes] = 0  # tokens past the tokenizer's vocabulary: never allowed
        keep[np.asarray(nodes)[:, None], np.arange(allowed.shape[1])] = allowed
    keep = mx.array(keep).astype(mx.float32)
    return logits.astype(mx.float32) + (1.0 - keep) * MASKED


# -- compiling, cached per process -------------------------------------------------------

_lock = threading.Lock()
_tokenizers: dict[tuple[int, int], tuple[Any, Any]] = {}  # (id(tokenizer), vocab) -> (it, LL)
_grammars: dict[tuple[str, int, int], Grammar] = {}
compiles = 0  # grammars compiled by this process (a job's schema: once)


def schema_of(response_format: dict) -> dict:
    """The JSON Schema a `response_format` asks for."""
    kind = response_format.get("type")
    if kind == "json_object":
        return JSON_OBJECT
    if kind == "json_schema":
        spec = response_format.get("json_schema") or {}
        schema = spec.get("schema")
        if schema is None:
            return JSON_OBJECT
        if not isinstance(schema, dict):
            raise GrammarError("json_schema.schema must be a JSON object")
        return schema
    raise GrammarError(f"response_format type {kind!r} is not json_object or json_schema")


def canonical(response_format: dict) -> str:
    """The cache key of a format: its schema as compact JSON. Key order is kept: the order
    of `properties` is the order of the answer's keys (whatever `name`, `strict` or the
    spacing of the request)."""
    return json.dumps(schema_of(response_format), separators=(",", ":"), ensure_ascii=False)


def ll_tokenizer(tokenizer: Any, vocab_size: int | None = None) -> Any:
    """llguidance's view of an mlx-lm `TokenizerWrapper` (built once per tokenizer)."""
    import llguidance.hf

    key = (id(tokenizer), vocab_size or 0)
    with _lock:
        hit = _tokenizers.get(key)
    if hit is not None and hit[0] is tokenizer:
        return hit[1]
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    eos = sorted(getattr(tokenizer, "eos_token_ids", None) or [hf.eos_token_id])
    ll = llguidance.hf.from_tokenizer(hf, n_vocab=vocab_size, eos_token=eos)
    with _lock:
        _tokenizers[key] = (tokenizer, ll)  # the tokenizer kept: its id stays its own
    return ll


def compile_format(response_format: dict, tokenizer: Any, vocab_size: int | None = None) -> Grammar:
    """The compiled grammar of a `response_format` for a tokenizer (cached per process).

    Raises:
        GrammarError: the schema is not one the engine supports; the message names what.
    """
    global compiles
    import llguidance

    key = canonical(response_format)
    ll = ll_tokenizer(tokenizer, vocab_size)
    ck = (key, id(ll), vocab_size or 0)
    with _lock:
        hit = _grammars.get(ck)
    if hit is not None:
        return hit
    try:
        text = llguidance.LLMatcher.grammar_from_json_schema(key, overrides=JSON_OPTIONS)
    except ValueError as e:
        raise GrammarError(f"the schema is not valid JSON Schema: {e}") from None
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, ll)
    if is_error:
        raise GrammarError(_explain(messages[0] if messages else "the schema does not compile"))
    grammar = Grammar(key, text, ll, (ll.vocab_size + 31) // 32)
    with _lock:
        _grammars[ck] = grammar
        compiles += 1
    return grammar


def check_format(response_format: dict, tokenizer: Any) -> None:
    """Raise GrammarError naming what is unsupported in a `response_format` (the tokenizer
    alone is needed: `submit` checks lines before any model is loaded)."""
    compile_format(response_format, tokenizer)


def _explain(message: str) -> str:
    """llguidance's error, first line, without its internal context."""
    return message.strip().splitlines()[0][:300]
