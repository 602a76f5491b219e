"""Tree drafting: several candidate continuations verified in one forward.

Candidates: prompt lookup with *every* earlier match of the longest suffix (several matches
give several branches, weighted by how often each continuation followed), grown best-first
(EAGLE-2 style), merged with a draft model's greedy chain and its top-k alternatives at each
depth when a draft model is configured. All candidates are deterministic (`probs=None`), so
the one-hot acceptance rule keeps sampling lossless.

Size (Sequoia's idea): the node acceptance chance is estimated from per-sibling-rank
acceptance rates measured on this request; the drafter keeps the number of nodes n that
maximizes (1 + expected accepted nodes) / verify_cost(n + 1) on the machine's cost curve.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import mlx.core as mx

from ..costs import CostCurve
from ..draft_length import PROBE_EVERY
from ..forward import forward, last_logits, make_cache, trim
from ..model import LoadedModel
from ..tree import TokenTree, best_first, dynamic_tree, merge
from .base import Draft, DraftSampler
from .ngram import NGRAM_SIZES

MAX_NODES = 32
MAX_RANKS = 8


class NgramCandidates:
    """Every earlier occurrence of the longest matching suffix (sizes 3, 2, 1), indexed
    incrementally; `expand` returns the continuations seen after it with their frequency."""

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = sizes
        self.history: list[int] = []
        self._index: dict[tuple[int, ...], list[int]] = defaultdict(list)
        self._indexed = 0

    def reset(self) -> None:
        self.history = []
        self._index.clear()
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


class ModelCandidates:
    """A draft model's greedy chain of `depth` tokens with its top-`width` alternatives at
    each depth as leaves (one draft forward per depth, own cache, rolled back each step)."""

    def __init__(self, draft: LoadedModel, depth: int = 4, width: int = 3):
        self.draft = draft
        self.depth, self.width = depth, width
        self.cache = make_cache(draft.model)
        self._seen = 0

    def reset(self) -> None:
        self.cache = make_cache(self.draft.model)
        self._seen = 0

    def tree(self, history: list[int]) -> TokenTree:
        model = self.draft.model
        tree = TokenTree.root(history[-1])
        logits = last_logits(model, mx.array([history[self._seen :]], mx.int32), self.cache)[0]
        self._seen = len(history)
        parent, fed = 0, 0
        for d in range(self.depth):
            probs = mx.softmax(logits.astype(mx.float32))
            top = mx.argsort(-probs)[: self.width]
            toks, ps = top.tolist(), probs[top].tolist()  # host sync, once per depth
            kids = [
                tree.add(parent, t, tree.scores[parent] * p) for t, p in zip(toks, ps, strict=True)
            ]
            parent = kids[0]
            if d + 1 < self.depth:
                logits = forward(model, mx.array([[toks[0]]], mx.int32), self.cache)[0, -1]
                fed += 1
        trim(self.cache, fed)  # back to the history; accepted tokens are fed next step
        return tree

    def static(self, history: list[int], shape: list[int]) -> TokenTree:
        """A static-shape tree: every node at depth d gets the draft's top `shape[d]` tokens.

        The draft model scores each level with the tree forward over its own cache (one
        draft forward per depth), which is then rolled back to the history."""
        from ..tree_forward import tree_forward

        model = self.draft.model
        if len(history) - 1 > self._seen:  # the prefix: history without the root
            forward(model, mx.array([history[self._seen : -1]], mx.int32), self.cache)
        self._seen = len(history) - 1
        tree = TokenTree.root(history[-1])
        frontier = [0]
        for width in shape:
            logits = tree_forward(model, tree, self.cache)[0]  # (N, V)
            trim(self.cache, tree.size)
            probs = mx.softmax(logits[mx.array(frontier)].astype(mx.float32), axis=-1)
            top = mx.argsort(-probs, axis=-1)[:, :width]  # (F, width)
            toks = top.tolist()
            ps = mx.take_along_axis(probs, top, axis=-1).tolist()  # host sync, once per depth
            frontier = [
                tree.add(i, t, tree.scores[i] * p)
                for i, row_t, row_p in zip(frontier, toks, ps, strict=True)
                for t, p in zip(row_t, row_p, strict=True)
            ]
        return tree


class RankStats:
    """Per sibling rank r: how often the r-th child is accepted when its parent was and
    every earlier sibling was not (counts with a prior)."""

    def __init__(self, prior: tuple[float, ...] = (0.6, 0.25, 0.15, 0.1), weight: float = 4.0):
        self.hits = [weight * (prior[r] if r < len(prior) else prior[-1]) for r in range(MAX_RANKS)]
        self.tries = [weight] * MAX_RANKS

    def rate(self, r: int) -> float:
        r = min(r, MAX_RANKS - 1)
        return self.hits[r] / self.tries[r]

    def node_chances(self, tree: TokenTree) -> list[float]:
        """(N,) estimated probability that each node ends up on the accepted path."""
        chance = [1.0] * tree.size
        miss = [1.0] * tree.size  # running product of (1 - rate) over earlier siblings
        rank = [0] * tree.size
        seen: Counter = Counter()
        for i in range(1, tree.size):
            p = tree.parents[i]
            rank[i] = seen[p]
            seen[p] += 1
            a = self.rate(rank[i])
            chance[i] = chance[p] * miss[p] * a
            miss[p] *= 1.0 - a
        return chance

    def observe(self, tree: TokenTree, path: list[int]) -> None:
        """Count the tries and hits of one verify step (`path`: accepted nodes from the root).

        Children of an accepted node are tried in order until one is accepted."""
        taken = {tree.parents[c]: c for c in path[1:]}  # accepted node -> its accepted child
        on_path = set(path)
        seen: Counter = Counter()
        for i in range(1, tree.size):
            p = tree.parents[i]
            r = min(seen[p], MAX_RANKS - 1)
            seen[p] += 1
            if p not in on_path or (p in taken and i > taken[p]):
                continue
            self.tries[r] += 1
            self.hits[r] += taken.get(p) == i


class TreeDrafter:
    """`--draft tree`: the engine's plan for tree drafts (begin / step / commit)."""

    name = "tree"

    def __init__(
        self,
        cost: CostCurve,
        draft_model: LoadedModel | None = None,
        max_nodes: int | None = None,
        width: int = 4,
        shape: list[int] | None = None,
    ):
        if shape is not None and draft_model is None:
            raise ValueError("a static tree shape (tree:3,2,1) needs a draft model")
        self.shape = shape
        self.cost = cost
        self.ngram = NgramCandidates()
        self.model = ModelCandidates(draft_model) if draft_model is not None else None
        self.max_nodes = max_nodes or MAX_NODES
        self.fixed = max_nodes is not None
        self.width = width
        self.stats = RankStats()
        self._tree: TokenTree | None = None
        self._idle = 0

    def begin(self, prompt: list[int]) -> None:
        self.ngram.reset()
        if self.model is not None:
            self.model.reset()
        self.stats = RankStats()

    def candidates(self, history: list[int]) -> TokenTree:
        """Every candidate the drafters offer after `history`, one trie."""
        if self.shape is not None:  # exactly the requested shape, from the draft model
            return self.model.static(history, self.shape)
        self.ngram.update(history)
        ctx = history[:-1]
        trees = [
            dynamic_tree(
                history[-1], lambda path: self.ngram.expand(ctx + path), self.max_nodes, self.width
            )
        ]
        if self.model is not None:
            trees.append(self.model.tree(history))
        return merge(trees)

    def size(self, tree: TokenTree) -> int:
        """The node count with the most expected tokens per unit of verify time."""
        if self.fixed or self.shape is not None:
            return min(self.max_nodes, tree.size - 1) if self.fixed else tree.size - 1
        ordered = best_first(tree, self.max_nodes)
        chances = self.stats.node_chances(ordered)
        by_score = sorted(range(1, ordered.size), key=lambda i: (-ordered.scores[i], i))
        best, best_rate, expected = 0, 1.0, 1.0
        for n, i in enumerate(by_score, start=1):
            expected += chances[i]
            rate = expected / self.cost.relative(n + 1)
            if rate > best_rate * 1.0001:
                best, best_rate = n, rate
        return best

    def step(self, history: list[int], sampler: DraftSampler) -> Draft:
        tree = self.candidates(history)
        n = self.size(tree) if tree.size > 1 else 0
        if n == 0 and tree.size > 1:
            self._idle += 1
            n = int(self._idle % PROBE_EVERY == 0)  # re-probe so the estimates can recover
        if n == 0:
            self._tree = None
            return Draft(tokens=mx.zeros((1, 0), mx.int32), source="none")
        self._tree = best_first(tree, n)
        return self._tree.to_draft(self.name)

    def commit(self, draft: Draft, num_accepted: int, path: list[int] | None = None) -> None:
        if self._tree is not None and path is not None:
            self.stats.observe(self._tree, path)


def compare(model: str = "smollm2-135m", prompts: int = 3, max_tokens: int = 64) -> None:
    """Mean accepted length of `tree` vs the chain drafters on the bench prompts (greedy, the
    accelerator-like flat cost curve so sizes do not depend on this machine's load), with a
    check that every output equals plain decoding."""
    from ..benchmark import encode, load_prompts
    from ..generate import Engine
    from ..loading import load_model
    from ..sampling import GenerationParams

    target = load_model(model)
    flat = CostCurve.flat()
    params = GenerationParams(max_tokens=max_tokens)
    configs = {"none": {}, "ngram": {}, "ngram/k4": {"k": 4}, "tree": {}}
    for item in load_prompts()[:prompts]:
        prompt = encode(target, item)
        want = None
        for name, kw in configs.items():
            eng = Engine(target, draft=name.split("/")[0], cost=flat, profile=False, **kw)
            r = eng.generate(prompt, params)
            want = r.tokens if want is None else want
            s = r.speculative
            print(
                f"{item.get('category', '?'):<11} {name:<9} accepted len "
                f"{s['mean_accepted_length']:.2f}  accept rate {s['acceptance_rate']:.2f}  "
                f"steps {s['verify_steps']:>3}  identical {r.tokens == want}",
                flush=True,
            )


if __name__ == "__main__":
    import sys

    compare(*(int(a) if a.isdigit() else a for a in sys.argv[1:]))
