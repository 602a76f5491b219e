"""Token trees as flat arrays: tokens, parent index, depth; mask and positions derive from them.

Node 0 is the root, the row's pending token (not yet in the target's cache); every other
node is a draft token whose parent comes before it. A chain is `parents = [-1, 0, 1, ...]`.
`Draft.parents` uses the drafts-only convention (-1 = the root), `TokenTree` includes it.

Builders take an `expand(path) -> [(token, prob), ...]` callback (candidates after the path
of tokens from the root, most likely first): `dynamic_tree` grows the nodes of highest
cumulative draft probability within a node budget (EAGLE-2), `merge` joins trees from
several drafters into one trie.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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
