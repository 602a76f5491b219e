"""Prompt lookup: propose what followed the latest earlier occurrence of what was just written.

Two matchers over prompt + output so far, both deterministic (`probs=None`):

- on characters (when the drafter has the tokenizer): the longest suffix of the text (3 to
  48 characters) that occurred earlier; its continuation is re-tokenized together with the
  last few tokens and proposed only where that re-tokenization reproduces those tokens.
  Models often split a copied span differently from the prompt (`"maria` after a quote vs
  ` maria` after a space); token n-grams miss those copies, characters do not.
- on tokens: the last 3, then 2, then 1 tokens, indexed incrementally (O(1) per token);
  copies forward like LZ77, so a match that overlaps the end extends periodically. Used
  when the character matcher finds nothing (or has no tokenizer).
"""

from __future__ import annotations

from collections.abc import Callable

from .base import Draft

NGRAM_SIZES = (3, 2, 1)
MIN_CHARS, MAX_CHARS = 3, 48
TAIL = 3  # tokens re-tokenized with the continuation to check the boundary
CHARS_PER_TOKEN = 8  # continuation text taken per proposed token (generous: cut at the end)


class DecodedText:
    """The decoded text of a growing token list, extended as it grows (not re-decoded)."""

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self._ids: list[int] = []
        self._text = ""

    def of(self, ids: list[int]) -> str:
        """decode(ids), extending the cached text when `ids` extends the cached ids."""
        n = len(self._ids)
        if len(ids) >= n and ids[:n] == self._ids:
            more = self.decode(ids[n:]) if len(ids) > n else ""
            if "\ufffd" not in more:  # a split multi-byte character: decode whole instead
                self._ids, self._text = list(ids), self._text + more
                return self._text
        self._ids, self._text = list(ids), self.decode(ids)
        return self._text


class TextIndex:
    """The decoded text of a growing token history, with suffix lookup on characters."""

    def __init__(self, decode: Callable[[list[int]], str], encode: Callable[[str], list[int]]):
        self.decode, self.encode = decode, encode
        self._head = DecodedText(decode)

    def lookup(self, history: list[int], k: int) -> list[int]:
        if len(history) <= TAIL:
            return []
        tail = history[-TAIL:]
        tail_text = self.decode(tail)
        text = self._head.of(history[:-TAIL]) + tail_text
        # Occurring earlier is monotone in the suffix length: binary search the longest.
        lo, hi, pos = MIN_CHARS - 1, min(MAX_CHARS, len(text) - 1), -1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            p = text.rfind(text[-mid:], 0, len(text) - 1)
            if p >= 0:
                lo, pos = mid, p + mid
            else:
                hi = mid - 1
        if pos < 0:  # not even MIN_CHARS characters occurred before
            return []
        cont = text[pos : pos + CHARS_PER_TOKEN * k + 1]
        ids = self.encode(tail_text + cont)
        if ids[:TAIL] != tail:
            return []  # the copy would not continue these tokens as the model wrote them
        ids = ids[TAIL:]
        if pos + len(cont) < len(text):
            ids = ids[:-1]  # the last token may be cut mid-word
        return ids[:k]


class PromptLookup:
    """One row's matchers over its prompt + output (indexed incrementally)."""

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES, text: TextIndex | None = None):
        self.sizes = sizes
        self.text = text
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # positions [0, _indexed) have their n-grams indexed

    def _update(self, history: list[int]) -> None:
        # Index n-grams ending at e for every e whose continuation e + 1 exists in history,
        # so a lookup of the current suffix finds an earlier occurrence, never itself.
        for e in range(self._indexed, len(history) - 1):
            for n in self.sizes:
                if e + 1 >= n:
                    self._index[tuple(history[e + 1 - n : e + 1])] = e
        self._indexed = max(self._indexed, len(history) - 1)

    def lookup(self, history: list[int], k: int) -> list[int]:
        """Up to `k` tokens continuing the latest earlier match of the longest suffix."""
        self._update(history)
        if k <= 0:
            return []
        if self.text is not None and (cont := self.text.lookup(history, k)):
            return cont
        return self.lookup_tokens(history, k)

    def lookup_tokens(self, history: list[int], k: int) -> list[int]:
        """The token matcher alone: the last 3, then 2, then 1 tokens."""
        for n in self.sizes:
            if len(history) < n:
                continue
            e = self._index.get(tuple(history[-n:]))
            if e is not None:
                # Copy forward like LZ77: a match that overlaps the end extends periodically.
                cont: list[int] = []
                for i in range(e + 1, e + 1 + k):
                    cont.append(history[i] if i < len(history) else cont[i - len(history)])
                return cont
        return []


class NgramDrafter:
    """`--draft ngram`: prompt lookup for every row (a lookup: the policy truncates)."""

    name = kind = "ngram"
    lookup = True
    calibrated = False
    prior = None  # its kind's guessed prior

    def __init__(self, target=None):
        # With the target's tokenizer, copies are matched on characters too.
        self._text = (
            (lambda: TextIndex(target.decode, target.encode_text)) if target is not None else None
        )

    def admit(self, seq) -> None:
        seq.state[self.name] = PromptLookup(text=self._text() if self._text else None)

    def propose(self, seqs, ks: list[int]) -> Draft:
        toks = [s.state[self.name].lookup(s.history, k) for s, k in zip(seqs, ks, strict=True)]
        return Draft(sizes=[len(t) for t in toks], tokens=toks, source=self.name)

    def commit(self, seqs, draft: Draft, paths) -> None:
        pass

    def retire(self, seq) -> None:
        seq.state.pop(self.name, None)

    def step_cost(self, rows: int) -> float:
        return 0.0

    def evidence(self) -> int:
        return 0
