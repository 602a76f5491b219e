"""Job-level suffix drafting: continue a row with what the job's finished answers wrote after
the longest match of its recent text (SuffixDecoding, arXiv 2411.04975, on characters).

A labeling job is thousands of prompts whose answers share their shape (the same keys, label
words and phrasing); prompt lookup only copies from a row's own prompt. A `SuffixIndex` holds
the text of the job's finished answers (weight 1) and of its prompts (weight `PROMPT_WEIGHT`),
each document behind a run of start markers, so a row that has just begun its answer matches
every answer's start. A query finds the positions that follow the longest suffix of the row's
answer so far (up to `MAX_MATCH` characters), then walks the most frequent continuation
character by character; each character's share of the weighted candidates is its confidence.

Rows still generating are documents too: each row writes its answer so far into a region of
the index reserved when it joins (`SuffixIndex.open`), so rows of one batch draft from the
rows ahead of them, and a job's first wave (every row admitted together, nothing finished
yet) drafts from itself. A live answer's next character is `PENDING`: a candidate there is
unknown, not an end, and is dropped.

Characters, not tokens: two answers that tokenize the same text differently still match. The
continuation is re-tokenized together with the row's last tokens, so a word the row has begun
is completed in the tokens a fresh tokenization would use; where that re-tokenization does not
reproduce the row's own last tokens (the row split a word otherwise), the continuation's own
tokens are proposed.

The drafter is deterministic (`probs=None`): acceptance is by equality, output is lossless.
Chances for the draft-length policy come from the counts, calibrated by this drafter's own
measured acceptance per (share, support) bucket.
"""

from __future__ import annotations

import math
from array import array
from collections import OrderedDict
from typing import Any

import numpy as np

from ..confidence import Confidence
from .base import Draft
from .ngram import TAIL, DecodedText

START, PROMPT_START, END = "\x02", "\x01", "\x03"  # an answer's start, a prompt's, any end
PENDING = 0x110000  # beyond Unicode: a live answer's next character, not written yet
DEAD = 0x110001  # a live region given up (its text re-added whole): never a candidate
KEY = 4  # characters of the hashed key; longer matches are found by extending backwards
MAX_MATCH = 64  # longest context compared
MIN_MATCH = 6  # shorter matches propose nothing, unless anchored at the answer's start
PROMPT_WEIGHT = 0.2  # a prompt's continuation counts this much against an answer's
MAX_CHARS = 4_000_000  # per job: the oldest documents go first beyond this
CHARS_PER_TOKEN = 4  # continuation characters walked per requested token (cut at the end)
BACK_BLOCK = 16  # characters of the context compared at once while extending a match
WALKED = 128  # a walk follows the longest match's most recent candidates, this many at most
LIVE_START = 1024  # characters a live answer reserves at first; it moves to twice that when full
LIVE_MAX = 16_384  # characters a live answer holds at most (its whole text lands on finish)
AHEAD = 16  # tokens walked beyond those asked for, kept for the row's next steps


class Live:
    """An answer being generated: its region of the index (text from `start`, room for `cap`
    characters and an end) and the text written there so far."""

    __slots__ = ("start", "cap", "text", "stale")

    def __init__(self, cap: int):
        self.start, self.cap, self.text, self.stale = 0, cap, "", False


class SuffixIndex:
    """The text of one job's documents, and an index from every `KEY`-character context to
    the positions that follow it.

    Adding documents one by one gives the same index as building it from all of them at once
    (`rebuild`); beyond `max_chars` the oldest documents are dropped and the rest re-indexed.
    """

    def __init__(self, max_chars: int = MAX_CHARS):
        self.max_chars = max_chars
        self.docs: list[tuple[str, float]] = []  # (text, weight), oldest first
        self.outputs = 0  # answers added (prompts excluded)
        self._live: dict[int, Live] = {}  # id -> answers being generated
        self.rebuild()

    def rebuild(self, docs: list[tuple[str, float]] | None = None) -> None:
        docs = self.docs if docs is None else docs
        self.docs = []
        # MAX_MATCH leading zeros: a backward comparison never reads before the start.
        self._chars = np.zeros(MAX_MATCH + 1024, np.uint32)
        self._weights = np.zeros_like(self._chars, dtype=np.float32)
        self._n = MAX_MATCH
        self._index: dict[str, array] = {}
        for text, weight in docs:
            self._append(text, weight)
        for live in self._live.values():
            text, live.text, live.stale = live.text, "", False
            self._place(live)
            self.extend(live, text)

    @property
    def chars(self) -> int:
        """Characters held (markers included)."""
        return self._n - MAX_MATCH

    def nbytes(self) -> int:
        """Memory held by the arrays and the position lists (the bound's measure)."""
        lists = sum(a.itemsize * len(a) for a in self._index.values())
        return int(self._chars.nbytes + self._weights.nbytes + lists)

    def add(self, text: str, weight: float = 1.0) -> None:
        """One finished answer (weight 1) or a prompt (`PROMPT_WEIGHT`, behind its own start
        marker: an answer that has just begun matches answers' starts only)."""
        if not text:
            return
        if weight >= 1.0:
            self.outputs += 1
        self._make_room(len(text) + KEY + 1)
        self._append(text, weight)

    def _make_room(self, need: int) -> bool:
        """Beyond the bound, keep the newest documents that fit in half of it (live regions
        are kept and placed again); True if it rebuilt."""
        if self.chars + need <= self.max_chars:
            return False
        keep, total = [], need + self._live_held()
        for t, w in reversed(self.docs):  # newest first, while they fit in half the bound
            total += len(t) + KEY + 1
            if total > self.max_chars // 2:
                break
            keep.append((t, w))
        self.rebuild(keep[::-1])
        return True

    # -- live answers -----------------------------------------------------------------

    def open(self, reserve: int) -> Live:
        """An answer begins: a region for up to `reserve` characters of it (`LIVE_START` at
        most, moved to a larger one as it grows); `extend` writes its text, `close` or
        `abandon` ends it."""
        room = self._live_room()
        live = Live(max(1, min(reserve, LIVE_START, room)))
        live.stale = live.cap > room  # live regions hold half the bound at most
        self._make_room(live.cap + KEY + 1)
        self._place(live)
        self._live[id(live)] = live
        return live

    def _live_room(self) -> int:
        """Characters a new or larger live region may still take."""
        return self.max_chars // 2 - self._live_held() - KEY - 1

    def _live_held(self) -> int:
        """Characters the live regions hold, markers and ends included."""
        return sum(v.cap + KEY + 1 for v in self._live.values())

    def _move(self, live: Live, cap: int) -> None:
        """A live answer outgrew its region: it moves to a new one of `cap` characters."""
        self._kill(live)
        text, live.text, live.cap = live.text, "", cap
        if not self._make_room(KEY + cap + 1):  # a rebuild places every live region itself
            self._place(live)
        self.extend(live, text)

    def _place(self, live: Live) -> None:
        n0 = self._n
        self._grow(n0 + KEY + live.cap + 1)
        self._chars[n0 : n0 + KEY] = ord(START)
        self._chars[n0 + KEY : n0 + KEY + live.cap + 1] = PENDING
        self._weights[n0 : n0 + KEY + live.cap + 1] = 1.0
        self._n = n0 + KEY + live.cap + 1
        live.start = n0 + KEY
        self._index.setdefault(START * KEY, array("i")).append(live.start)

    def extend(self, live: Live, text: str) -> None:
        """The live answer's text so far (it only grows: text that rewrites what was written,
        or outgrows `LIVE_MAX`, stops the region where it is)."""
        if live.stale or text == live.text:
            return
        if not text.startswith(live.text):
            live.stale = True
            return
        if len(text) > live.cap:
            room = self._live_room() + live.cap + KEY + 1  # its own region is given up
            cap = min(max(2 * live.cap, len(text)), LIVE_MAX, room)
            if len(text) > cap:
                live.stale = True
                return
            self._move(live, cap)
        w, new = len(live.text), text[len(live.text) :]
        p0 = live.start + w
        self._chars[p0 : p0 + len(new)] = np.frombuffer(new.encode("utf-32-le"), np.uint32)
        # (the end marker stands for the next, unwritten character: its position is indexed)
        self._index_doc(START * KEY + text + END, live.start - KEY, KEY + w + 1)
        live.text = text

    def close(self, live: Live, text: str) -> None:
        """The live answer finished as `text`: it becomes a finished answer (in place when
        its region holds it, else added whole)."""
        if self._live.pop(id(live), None) is None:
            return
        self.extend(live, text)
        if live.stale or live.text != text or not text:
            self._kill(live)
            self.add(text)
            return
        end = live.start + len(text)
        self._chars[end : live.start + live.cap + 1] = ord(END)
        self.docs.append((text, 1.0))
        self.outputs += 1

    def abandon(self, live: Live) -> None:
        """The answer will not finish here (cancelled, handed back): its region goes."""
        if self._live.pop(id(live), None) is not None:
            self._kill(live)

    def _kill(self, live: Live) -> None:
        lo, hi = live.start - KEY, live.start + live.cap + 1
        self._chars[lo:hi] = DEAD
        self._weights[lo:hi] = 0.0

    def _append(self, text: str, weight: float) -> None:
        self.docs.append((text, weight))
        doc = (START if weight >= 1.0 else PROMPT_START) * KEY + text + END
        codes = np.frombuffer(doc.encode("utf-32-le"), np.uint32)
        n0, n1 = self._n, self._n + len(codes)
        self._grow(n1)
        self._chars[n0:n1] = codes
        self._weights[n0:n1] = weight
        self._n = n1
        self._index_doc(doc, n0, KEY)

    def _index_doc(self, doc: str, n0: int, first: int) -> None:
        """Index positions n0 + first .. n0 + len(doc) - 1 of a document placed at n0 (with
        its markers): each follows the `KEY` characters before it."""
        index = self._index
        for i in range(first, len(doc)):  # position n0 + i follows doc[i - KEY : i]
            key = doc[i - KEY : i]
            pos = index.get(key)
            if pos is None:
                index[key] = pos = array("i")
            pos.append(n0 + i)

    def _grow(self, n: int) -> None:
        if n > len(self._chars):
            size = max(n, 2 * len(self._chars))
            self._chars = np.concatenate(
                [self._chars, np.zeros(size - len(self._chars), np.uint32)]
            )
            self._weights = np.concatenate(
                [self._weights, np.zeros(size - len(self._weights), np.float32)]
            )

    def continuation(self, query: str, n_chars: int) -> tuple[str, list[float], list[int]]:
        """`walk`'s text, shares and support."""
        return self.walk(query, n_chars)[:3]

    def walk(self, query: str, n_chars: int) -> tuple[str, list[float], list[int], bool]:
        """The most frequent continuation of the longest suffix of `query` (an answer's text so
        far, behind `START * KEY`) that occurs in the index, up to `n_chars` characters,
        among that suffix's `WALKED` most recent occurrences.

        Returns the text, per character its weighted share among the candidates still on the
        path, the number of those candidates that are answers (0: prompts only), and
        whether the walk ended at an end (the answers on its path end there; not at the
        length asked, nor at text not written yet). It reads the query's last `MAX_MATCH`
        characters only.
        """
        q = np.frombuffer(query[-MAX_MATCH:].encode("utf-32-le"), np.uint32)
        pos = self._index.get(query[-KEY:])
        if pos is None or n_chars <= 0:
            return "", [], [], False
        cand = np.frombuffer(pos, np.int32).astype(np.int64)
        chars, length = self._chars, KEY
        # Not yet written (a live answer's end: the querying row's own, among others) or
        # given up: no candidate.
        cand = cand[(chars[cand] != PENDING) & (chars[cand - 1] == q[-1])]
        if cand.size == 0:
            return "", [], [], False
        rq = q[::-1]  # rq[j]: the character j + 1 places before the query's end
        while length < len(q):  # extend the match backwards while some candidate agrees
            m = min(BACK_BLOCK, len(q) - length)  # the next m characters back, at once
            steps = length + 1 + np.arange(m)
            ok = chars[cand[:, None] - steps] == rq[steps - 1]  # (C, m)
            runs = np.where(ok.all(axis=1), m, ok.argmin(axis=1))  # agreeing run per candidate
            best = int(runs.max())
            if best == 0:
                break
            cand, length = cand[runs == best], length + best
            if best < m:  # every candidate left disagrees on the next character back
                break
        anchored = length >= len(q) or query[-length - 1 : -length] == START
        if length < MIN_MATCH and not anchored:
            return "", [], [], False
        if cand.size > WALKED:  # the latest: what the job writes now, at a bounded cost
            cand = np.partition(cand, cand.size - WALKED)[-WALKED:]
        return self._walk(cand, n_chars)

    def _walk(self, cand: np.ndarray, n_chars: int) -> tuple[str, list[float], list[int], bool]:
        """The heaviest path through the candidates' next `n_chars` characters.

        One character at a time, the rule is: where every candidate left agrees, that
        character (an end, or text not written yet, stops the walk); where they differ, the
        candidates whose next character is not written yet drop out and the character of
        the most weight wins (on a tie, the one with the most recent candidate), its share
        of the weight its confidence. The walk runs on the candidates' windows sorted as
        strings: candidates that share a path are a contiguous range, the characters they
        all agree on come at once, and a branch is a split of the range where neighbours'
        common prefixes end.
        """
        n = n_chars
        win = self._chars[np.minimum(cand[:, None] + np.arange(n), self._n - 1)]  # (C, n)
        if cand.size > 1:
            keyed = np.empty((cand.size, n + 1), ">u4")  # big-endian: bytes sort as the codes
            keyed[:, :n] = win
            keyed[:, n] = 0xFFFFFFFF  # never a trailing zero byte (numpy strips those)
            order = np.argsort(keyed.view(f"S{4 * (n + 1)}").ravel(), kind="stable")
            win, cand = win[order], cand[order]
            differ = win[1:] != win[:-1]
            lcp = np.where(differ.any(axis=1), differ.argmax(axis=1), n).tolist()
        else:
            lcp = []
        w = self._weights[cand]
        wts, pos = w.tolist(), cand.tolist()
        below = np.concatenate([[0], np.cumsum(w >= 1.0)]).tolist()  # answers before each
        end = ord(END)
        out: list[int] = []
        shares: list[float] = []
        support: list[int] = []
        lo, hi, d, ended = 0, len(pos), 0, False
        answers = below[-1]  # candidates from answers (prompts weigh less)
        while d < n:
            split = min(lcp[lo : hi - 1], default=n)  # columns d .. split-1: all agree
            if split > d:
                seg = win[lo, d:split].tolist()
                cut = min(seg.index(c) if c in seg else len(seg) for c in (end, PENDING))
                out += seg[:cut]
                shares += [1.0] * cut
                support += [answers] * cut
                if cut < len(seg) or split >= n:
                    ended = cut < len(seg) and seg[cut] == end
                    break
                d = split
            col = win[lo:hi, d].tolist()
            groups, first = [], lo  # (character, lo, hi) of each branch
            for i in range(lo, hi - 1):
                if lcp[i] == d:
                    groups.append((col[first - lo], first, i + 1))
                    first = i + 1
            groups.append((col[first - lo], first, hi))
            weight = {  # text not written yet: unknown, not an end
                g: math.fsum(wts[g[1] : g[2]]) for g in groups if g[0] != PENDING
            }
            if not weight:
                break
            best = max(weight, key=lambda g: (weight[g], max(pos[g[1] : g[2]])))
            if best[0] == end:
                ended = True
                break
            out.append(best[0])
            shares.append(weight[best] / math.fsum(weight.values()) if len(weight) > 1 else 1.0)
            lo, hi, d = best[1], best[2], d + 1
            answers = below[hi] - below[lo]
            support.append(answers)
        return "".join(map(chr, out)), shares, support, ended


class Corpora:
    """The suffix indexes of the jobs a model is serving, keyed by job; the least recently
    used beyond `max_jobs` is dropped (a job that ends drops its own with `drop`)."""

    def __init__(self, max_jobs: int = 16, max_chars: int = MAX_CHARS):
        self.max_jobs, self.max_chars = max_jobs, max_chars
        self._indexes: OrderedDict[Any, SuffixIndex] = OrderedDict()

    def get(self, key: Any) -> SuffixIndex:
        index = self._indexes.get(key)
        if index is None:
            index = self._indexes[key] = SuffixIndex(self.max_chars)
            while len(self._indexes) > self.max_jobs:
                self._indexes.popitem(last=False)
        self._indexes.move_to_end(key)
        return index

    def drop(self, key: Any) -> None:
        self._indexes.pop(key, None)

    def __contains__(self, key: Any) -> bool:
        return key in self._indexes

    def answers(self) -> int:
        """Finished answers held, over every job's index."""
        return sum(index.outputs for index in self._indexes.values())

    def keys(self) -> list:
        return list(self._indexes)


class Calibration(Confidence):
    """How often a suffix node is accepted once its parent was, per bucket of its count
    share (10 bins) and support (answers behind it: none (prompts only), 1-3, 4-15, 16+)."""

    SUPPORT = (1, 4, 16)

    def __init__(self, weight: float = 4.0):
        centers = (np.arange(10) + 0.5) / 10
        trust = np.array([0.4, 0.6, 0.75, 0.85])  # prior: under the share, more so when rare
        super().__init__(centers[:, None] * trust[None, :], weight)

    def bucket(self, share: float, support: int) -> tuple[int, int]:
        return self.buckets([share], [support])[0]

    def buckets(self, shares, supports) -> list[tuple[int, int]]:
        """The (share bin, support bin) of each (share, support)."""
        b0 = np.minimum((np.asarray(shares) * 10).astype(np.int64), 9)
        b1 = np.searchsorted(self.SUPPORT, supports, side="right")
        return list(zip(b0.tolist(), b1.tolist(), strict=True))

    def rate(self, share: float, support: int) -> float:
        b0, b1 = self.bucket(share, support)
        return float(self.rates()[b0, b1])


class _Row:
    """One row's answer text so far (decoded incrementally), its job's index and its live
    region there, and the continuation of its last walk: tokens from output position `at`
    on, each with its calibration bucket, `whole` if that walk ended at an end."""

    def __init__(self, index: SuffixIndex, decode, reserve: int):
        self.index = index
        self.text = DecodedText(decode)
        self.live = index.open(reserve)
        self.ahead: list[int] = []
        self.buckets: list[tuple[int, int]] = []
        self.at, self.whole = 0, False

    def kept(self, output: list[int], k: int) -> bool:
        """The row went on as its last continuation said (every token since `at`), and what
        is left of it still holds the `k` tokens asked for, or all there is (`whole`: the
        walk ended where the answers on its path end): then that is moved up to the row's
        end. (A walk that stopped at live rows' unwritten text is walked again: they may
        have written further since.)"""
        n, at = len(output), self.at
        if not self.ahead or n <= at or output[at:] != self.ahead[: n - at]:
            return False
        left = len(self.ahead) - (n - at)
        if left <= 0 or (left < k and not self.whole):
            return False
        del self.ahead[: n - at], self.buckets[: n - at]
        self.at = n
        return True


class SuffixDrafter:
    """`--draft suffix`: every row drafts from its job's index (a lookup: the policy truncates).

    Rows of one job share one index (`Sequence.corpus` names the job); each row's prompt is
    added as it joins, its answer is written as it grows and kept when it finishes, so rows
    draft from the rows ahead of them and from every earlier answer.
    """

    name = kind = "suffix"
    lookup = True
    calibrated = True
    prior = None  # its kind's guessed prior

    def __init__(self, target, corpora: Corpora):
        self.target = target
        self.corpora = corpora
        self.calibration = Calibration()
        self._chars_of: dict[int, int] = {}  # token -> characters it decodes to, alone
        self._buckets: dict[int, list[tuple[int, int]]] = {}  # row uid -> last draft's buckets

    def admit(self, seq) -> None:
        index = self.corpora.get(seq.corpus)
        index.add(self.target.decode(seq.prompt), PROMPT_WEIGHT)
        reserve = CHARS_PER_TOKEN * 2 * seq.max_tokens
        seq.state[self.name] = _Row(index, self.target.decode, reserve)

    def propose(self, seqs, ks: list[int]) -> Draft:
        sizes, tokens, chances = [], [], []
        heads = []
        for s in seqs:  # every row's answer so far first: rows draft from each other's
            row: _Row = s.state[self.name]
            tail = s.output[-TAIL:]
            head = row.text.of(s.output[: len(s.output) - len(tail)])
            row.index.extend(row.live, head)
            heads.append((head, tail))
        # Rows that went on as their last walk said keep it; the others walk afresh. A
        # step's walks are shared by what they read of a row (its query's last `MAX_MATCH`
        # characters, its last tokens and the length asked): the index does not change
        # between them, and rows at one point of a template ask alike. Their continuations
        # are tokenized together.
        walks: dict = {}  # key -> (walk, tail, tail_text, k), then (ids, buckets, whole)
        walked: list[tuple[_Row, int, tuple]] = []
        for s, k, (head, tail) in zip(seqs, ks, heads, strict=True):
            row: _Row = s.state[self.name]
            if k <= 0 or row.kept(s.output, k):
                continue
            tail_text = self.target.decode(tail)
            query = START * KEY + head + tail_text
            n_chars = CHARS_PER_TOKEN * (k + AHEAD) + 1
            key = (id(row.index), query[-MAX_MATCH:], n_chars, tuple(tail))
            if key not in walks:
                walks[key] = (row.index.walk(query, n_chars), tail, tail_text, k + AHEAD)
            walked.append((row, len(s.output), key))
        todo = []
        for key, (w, tail, tail_text, k) in walks.items():
            if w[0]:
                todo.append((key, w, tail, tail_text, k))
            else:  # nothing walked
                walks[key] = ([], [], w[3])
        texts = self.target.encode_texts([tail_text + w[0] for _, w, _, tail_text, _ in todo])
        for (key, w, tail, _, k), ids in zip(todo, texts, strict=True):
            walks[key] = self._tokens(w, tail, ids, k)
        for row, n, key in walked:
            ids, buckets, whole = walks[key]
            row.ahead, row.buckets, row.at, row.whole = list(ids), list(buckets), n, whole
        rates = self.calibration.rates().tolist()
        for s, k in zip(seqs, ks, strict=True):
            ids, ch = self._proposal(s, k, rates) if k > 0 else ([], [])
            sizes.append(len(ids))
            tokens.append(ids)
            chances.append(ch)
        return Draft(sizes=sizes, tokens=tokens, chances=chances, source=self.name)

    def _proposal(self, s, k: int, rates: list[list[float]]) -> tuple[list[int], list[float]]:
        """The first `k` tokens of the row's continuation, with their chances."""
        row: _Row = s.state[self.name]
        ids, buckets = row.ahead[:k], row.buckets[:k]
        chances, p = [], 1.0
        for b, c in buckets:
            p *= rates[b][c]
            chances.append(p)
        if ids:
            self._buckets[s.uid] = buckets
        return ids, chances

    def _tokens(self, walked, tail: list[int], ids: list[int], k: int):
        """A walk's continuation as up to `k` tokens after the row's `tail` (`ids`: the
        tokens of the tail's text and the continuation together), each with its
        calibration bucket, and whether the walk ended at an end."""
        cont, shares, support, whole = walked
        if ids[: len(tail)] == tail:
            ids = ids[len(tail) :]
        else:  # the row split its last word otherwise (`lab` + `el`): the rest's own tokens
            ids = self.target.encode_text(cont)
        if len(cont) > CHARS_PER_TOKEN * k:
            ids = ids[:-1]  # the walk stopped at the length asked: the last token may be cut
        ids = ids[:k]
        if not ids:
            return [], [], whole
        # A token is accepted if the walk's choice held for each of its characters: its
        # share is the product of theirs, its support that of its last (a token past the
        # walked characters takes the last character's).
        chars = self._chars_of
        for t in ids:
            if t not in chars:
                chars[t] = max(1, len(self.target.decode([t])))
        m = len(shares)
        ends = np.cumsum([chars[t] for t in ids])
        starts = ends - [chars[t] for t in ids]
        inside = int(np.searchsorted(starts, m))  # tokens that begin within the walk
        share = np.full(len(ids), shares[-1])
        sup = np.full(len(ids), support[-1])
        if inside:
            within = np.asarray(shares[: min(int(ends[inside - 1]), m)])
            share[:inside] = np.multiply.reduceat(within, starts[:inside])
            sup[:inside] = np.asarray(support)[np.minimum(ends[:inside], m) - 1]
        return ids, self.calibration.buckets(share, sup), whole

    def commit(self, seqs, draft: Draft, paths) -> None:
        for s, size, path in zip(seqs, draft.sizes, paths, strict=True):
            buckets = self._buckets.pop(s.uid, None)
            if buckets:
                self.calibration.observe(buckets[:size], len(path))

    def retire(self, seq) -> None:
        row = seq.state.pop(self.name, None)
        self._buckets.pop(seq.uid, None)
        if row is None:
            return
        if seq.finish_reason is not None and seq.output:
            text = self.target.decode(seq.output)
            if seq.text_end is not None:
                text = text[: seq.text_end]
            row.index.close(row.live, text)
        else:
            row.index.abandon(row.live)

    def step_cost(self, rows: int) -> float:
        return 0.0

    def evidence(self) -> int:
        return self.corpora.answers()
