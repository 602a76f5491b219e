"""Tree drafting: several candidate continuations per row, verified in one forward.

Per row the tree's first branch is exactly what prompt lookup would draft as a chain (the
character matcher, else the token n-grams); every other earlier occurrence of the longest
matching suffix adds its continuation as a sibling branch, weighted by how often it
followed (grown best-first, EAGLE-2 style). Nodes are ordered by their estimated chance of
being accepted, so the policy's prefix of a tree is a tree, and the first branch is never
cut before an alternative: a tree accepts at least what its best chain would.

Chances come from this drafter's own measurements: the first child of a node (the chain's
continuation) is accepted with the per-position rate h_depth (draft_length.AcceptanceStats,
as for chains), a later sibling with the per-rank rate of siblings tried after the earlier
ones failed (`RankStats`). All candidates are deterministic, so acceptance is by equality.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from ..draft_length import K_MAX
from ..tree import TokenTree, dynamic_tree, merge
from .base import Draft
from .ngram import NGRAM_SIZES, PromptLookup, TextIndex

MAX_NODES = 32
MAX_RANKS = 8
WIDTH = 4  # alternatives considered per node


class NgramCandidates:
    """Every earlier occurrence of the longest matching suffix (sizes 3, 2, 1), indexed
    incrementally; `expand` returns the continuations seen after it with their frequency."""

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = sizes
        self.history: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self._indexed = 0

    def update(self, history: list[int]) -> None:
        self.history = history
        for e in range(self._indexed, len(history) - 1):
            for n in self.sizes:
                if e + 1 >= n:
                    self._index[tuple(history[e + 1 - n : e + 1])].append(e)
        self._indexed = max(self._indexed, len(history) - 1)

    def expand(self, context: list[int]) -> list[tuple[int, float]]:
        """Next-token candidates after `context` (most frequent, then most recent, first)."""
        for n in self.sizes:
            if len(context) < n:
                continue
            ends = self._index.get(tuple(context[-n:]))
            if ends:
                counts = Counter(self.history[e + 1] for e in ends)
                latest = {self.history[e + 1]: e for e in ends}
                total = sum(counts.values())
                ranked = sorted(counts, key=lambda t: (-counts[t], -latest[t]))
                return [(t, counts[t] / total) for t in ranked]
        return []


class RankStats:
    """Per sibling rank r >= 1: how often the r-th child is accepted when its parent was and
    every earlier sibling was not (counts with a prior)."""

    def __init__(self, prior: tuple[float, ...] = (0.25, 0.15, 0.1), weight: float = 4.0):
        self.hits = [weight * (prior[r] if r < len(prior) else prior[-1]) for r in range(MAX_RANKS)]
        self.tries = [weight] * MAX_RANKS

    def rate(self, r: int) -> float:
        r = min(r - 1, MAX_RANKS - 1)
        return self.hits[r] / self.tries[r]

    def observe(self, r: int, hit: bool) -> None:
        r = min(r - 1, MAX_RANKS - 1)
        self.tries[r] += 1
        self.hits[r] += hit


def chances(tree: TokenTree, first_rate, later_rate) -> list[float]:
    """(N,) each node's estimated chance of ending on the accepted path (root: 1).

    A node's first child is accepted with first_rate(depth), a later one (rank r) with
    later_rate(r) once every earlier sibling failed."""
    n = tree.size
    chance, miss, kids = [1.0] * n, [1.0] * n, Counter()
    depth = tree.depths()
    for i in range(1, n):
        p = tree.parents[i]
        rank = kids[p]
        kids[p] += 1
        a = first_rate(depth[i] - 1) if rank == 0 else later_rate(rank)
        chance[i] = chance[p] * miss[p] * a
        miss[p] *= 1.0 - a
    return chance


def by_chance(tree: TokenTree, chance: list[float], budget: int) -> tuple[TokenTree, list[float]]:
    """The `budget` likeliest nodes, in order of falling chance (parents first: a child's
    chance never exceeds its parent's), and their chances."""
    order = sorted(range(1, tree.size), key=lambda i: (-chance[i], i))[:budget]
    out, where, kept = TokenTree.root(tree.tokens[0]), {0: 0}, []
    for i in order:
        if tree.parents[i] in where:
            where[i] = out.add(where[tree.parents[i]], tree.tokens[i])
            kept.append(chance[i])
    return out, kept


class TreeDrafter:
    """`--draft tree`: per-row trees of prompt-lookup candidates (a lookup drafter)."""

    name = kind = "tree"
    lookup = True
    calibrated = False
    prior = None  # its kind's guessed prior

    def __init__(self, target):
        self.target = target
        self.ranks = RankStats()

    def admit(self, seq) -> None:
        t = self.target
        seq.state[self.name] = (
            PromptLookup(text=TextIndex(t.decode, t.encode_text)),
            NgramCandidates(),
        )

    def propose(self, seqs, ks: list[int]) -> Draft:
        sizes, tokens, parents, all_chances = [], [], [], []
        for s, k in zip(seqs, ks, strict=True):
            tree, ch = self._tree(s, min(k, MAX_NODES)) if k else (TokenTree.root(0), [])
            sizes.append(tree.size - 1)
            tokens.append(tree.tokens[1:])
            parents.append([p - 1 for p in tree.parents[1:]])  # drafts-only: -1 = root
            all_chances.append(ch)
        return Draft(sizes, tokens, parents=parents, chances=all_chances, source=self.name)

    def _tree(self, s, budget: int) -> tuple[TokenTree, list[float]]:
        lookup, cands = s.state[self.name]
        history = s.history
        chain = lookup.lookup(history, min(budget, K_MAX))
        cands.update(history)
        main = TokenTree.root(history[-1])
        at = 0
        for t in chain:
            at = main.add(at, t, 1.0)
        ctx = history[:-1]
        alt = dynamic_tree(history[-1], lambda path: cands.expand(ctx + path), budget, WIDTH)
        tree = merge([main, alt])  # the chain's nodes come first: rank 0 at each depth
        if tree.size == 1:
            return tree, []
        stats = s.stats[self.name].stats
        ch = chances(tree, lambda d: stats.rate(min(d, len(stats.hits) - 1)), self.ranks.rate)
        return by_chance(tree, ch, budget)

    def commit(self, seqs, draft: Draft, paths) -> None:
        """Per-rank counts for siblings after the first (the first child's per-position
        counts are the row's statistics, observed by the engine along the accepted path)."""
        for parents, path in zip(draft.parents, paths, strict=True):
            on_path = {-1, *path}
            taken = {parents[c]: c for c in path}
            kids: dict[int, list[int]] = defaultdict(list)
            for i, p in enumerate(parents):
                kids[p].append(i)
            for p, children in kids.items():
                if p not in on_path:
                    continue
                for rank, c in enumerate(children):
                    if rank >= 1:
                        self.ranks.observe(rank, taken.get(p) == c)
                    if taken.get(p) == c:
                        break

    def retire(self, seq) -> None:
        seq.state.pop(self.name, None)

    def step_cost(self, rows: int) -> float:
        return 0.0

    def evidence(self) -> int:
        return 0
