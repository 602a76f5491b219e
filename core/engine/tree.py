"""Token trees as flat arrays: tokens, parent index, depth; mask and positions derive from them.

Node 0 is the root, the last committed token (not yet in the target's cache); every other
node is a draft token whose parent comes before it. A chain is `parents = [-1, 0, 1, ...]`.
`Draft.parents` uses the drafts-only convention (-1 = the root), `TokenTree` includes it.

Builders take an `expand(path) -> [(token, prob), ...]` callback (candidates after the path
of tokens from the root, most likely first): `static_tree` fixes the branching per depth
(`3,2,1`), `dynamic_tree` grows the nodes of highest cumulative draft probability within a
node budget (EAGLE-2), `merge` joins trees from several drafters into one trie.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import numpy as np

from .drafters.base import Draft

Expand = Callable[[list[int]], list[tuple[int, float]]]


@dataclass
class TokenTree:
    """A token tree in topological order.

    Attributes:
        tokens: (N,) node tokens; tokens[0] is the root.
        parents: (N,) parent index; parents[0] == -1 and parents[i] < i.
        scores: (N,) draft probability of the path root -> node (1.0 at the root).
    """

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    scores: list[float] = field(default_factory=lambda: [1.0])

    @classmethod
    def root(cls, token: int) -> TokenTree:
        return cls([int(token)])

    @property
    def size(self) -> int:
        return len(self.tokens)

    def add(self, parent: int, token: int, score: float = 0.0) -> int:
        """Add `token` under `parent` (or return the sibling that already holds it)."""
        for i in range(parent + 1, self.size):
            if self.parents[i] == parent and self.tokens[i] == token:
                self.scores[i] = max(self.scores[i], score)
                return i
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        self.scores.append(float(score))
        return self.size - 1

    def depths(self) -> list[int]:
        d = [0] * self.size
        for i in range(1, self.size):
            d[i] = d[self.parents[i]] + 1
        return d

    def path(self, i: int) -> list[int]:
        """Node indices from the root to node i."""
        out = [i]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def path_tokens(self, i: int) -> list[int]:
        return [self.tokens[j] for j in self.path(i)]

    def ancestors(self) -> np.ndarray:
        """(N, N) bool: [i, j] when j is i or one of its ancestors."""
        anc = np.zeros((self.size, self.size), dtype=bool)
        for i in range(self.size):
            if self.parents[i] >= 0:
                anc[i] = anc[self.parents[i]]
            anc[i, i] = True
        return anc

    def attention_mask(self, prefix_len: int) -> mx.array:
        """(N, prefix_len + N) bool: each node sees the prefix, its ancestors and itself."""
        prefix = np.ones((self.size, prefix_len), dtype=bool)
        return mx.array(np.concatenate([prefix, self.ancestors()], axis=1))

    def positions(self, prefix_len: int) -> mx.array:
        """(N,) int32 RoPE positions: prefix length + depth."""
        return mx.array(np.array(self.depths(), dtype=np.int32) + prefix_len)

    def first(self, n: int) -> TokenTree:
        """The first n nodes (still a tree: parents come first)."""
        return TokenTree(self.tokens[:n], self.parents[:n], self.scores[:n])

    def to_draft(self, source: str = "tree") -> Draft:
        """The draft nodes as a `Draft` (tokens (1, N - 1); parents with -1 = the root)."""
        return Draft(
            tokens=mx.array([self.tokens[1:]], dtype=mx.int32).reshape(1, self.size - 1),
            parents=mx.array([p - 1 if p > 0 else -1 for p in self.parents[1:]], dtype=mx.int32),
            source=source,
        )

    @classmethod
    def from_draft(cls, root: int, draft: Draft) -> TokenTree:
        """The tree of a draft: its nodes under `root`, the last committed token."""
        toks = draft.tokens[0].tolist()
        if draft.parents is None:
            parents = list(range(-1, len(toks) - 1))
        else:
            parents = draft.parents.tolist()
        return cls([int(root)] + toks, [-1] + [p + 1 for p in parents], [1.0] * (len(toks) + 1))


def static_tree(root: int, expand: Expand, branching: Sequence[int]) -> TokenTree:
    """Every node at depth d gets the top `branching[d]` candidates of `expand`."""
    tree = TokenTree.root(root)
    frontier = [0]
    for width in branching:
        nxt = []
        for i in frontier:
            for tok, p in expand(tree.path_tokens(i))[:width]:
                nxt.append(tree.add(i, tok, tree.scores[i] * p))
        frontier = nxt
    return tree


def dynamic_tree(root: int, expand: Expand, budget: int, width: int = 4) -> TokenTree:
    """Best-first growth: add the candidate with the highest cumulative draft probability
    until `budget` draft nodes are in (EAGLE-2). Each added node is expanded (top `width`)."""
    tree = TokenTree.root(root)
    heap: list[tuple[float, int, int, int]] = []  # (-score, tiebreak, parent, token)
    count = 0

    def push(i: int) -> None:
        nonlocal count
        for tok, p in expand(tree.path_tokens(i))[:width]:
            heapq.heappush(heap, (-tree.scores[i] * p, count, i, tok))
            count += 1

    push(0)
    while heap and tree.size - 1 < budget:
        neg, _, parent, tok = heapq.heappop(heap)
        before = tree.size
        i = tree.add(parent, tok, -neg)
        if tree.size > before:
            push(i)
    return tree


def merge(trees: Sequence[TokenTree]) -> TokenTree:
    """One trie holding every path of `trees` (same root); identical siblings merge."""
    if not trees:
        raise ValueError("merge needs at least one tree")
    out = TokenTree.root(trees[0].tokens[0])
    for t in trees:
        if t.tokens[0] != out.tokens[0]:
            raise ValueError("trees to merge must share the root token")
        where = {0: 0}
        for i in range(1, t.size):
            where[i] = out.add(where[t.parents[i]], t.tokens[i], t.scores[i])
    return out


def best_first(tree: TokenTree, budget: int) -> TokenTree:
    """The `budget` draft nodes of highest score, re-ordered so parents still come first.

    Scores fall along every path, so the kept set is closed under taking parents."""
    keep = sorted(sorted(range(1, tree.size), key=lambda i: (-tree.scores[i], i))[:budget])
    out = TokenTree.root(tree.tokens[0])
    where = {0: 0}
    for i in keep:
        if tree.parents[i] in where:  # (a score tie may rank a child above its parent)
            where[i] = out.add(where[tree.parents[i]], tree.tokens[i], tree.scores[i])
    return out


def parse_shape(spec: str) -> list[int]:
    """`"3,2,1"` -> [3, 2, 1]; raises ValueError on anything but positive integers."""
    try:
        shape = [int(s) for s in spec.split(",") if s.strip()]
    except ValueError:
        raise ValueError(
            f"tree shape {spec!r}: expected comma-separated integers like 3,2,1"
        ) from None
    if not shape or min(shape) < 1:
        raise ValueError(f"tree shape {spec!r}: every branching factor must be at least 1")
    return shape
