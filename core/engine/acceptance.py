"""The one acceptance rule: a row keeps the draft nodes that equal the target's own tokens.

The target's token after every node is computed on the device (`sampling.choose`: the
argmax for greedy rows, the seeded exponential race for sampled rows, so the token at a
position depends only on the request's seed and its prefix). A row then walks its draft
tree from the root, following the child whose token equals the target's token after the
current node; the token after the last node it reaches is its correction or bonus token.
Greedy output is therefore exactly plain greedy decoding, and sampled output is exactly
plain sampling with the same seed: lossless for chains and trees alike, whatever the
drafter, and independent of which rows share the batch.

The walk runs on the host after the step's one sync (a few comparisons per row).
"""

from __future__ import annotations


def walk(tokens: list[int], parents: list[int] | None, choice: list[int]) -> tuple[list[int], int]:
    """One row's accepted path through its draft.

    Args:
        tokens: the draft nodes' tokens (the root, the pending token, not included).
        parents: each node's parent (-1 = the root), or None for a chain.
        choice: the target's token after the root and after each node: len(tokens) + 1.

    Returns:
        The accepted nodes in order (indices into `tokens`) and the next token.
    """
    path: list[int] = []
    want = choice[0]
    if parents is None:  # chain: accept while equal
        for i, t in enumerate(tokens):
            if t != want:
                break
            path.append(i)
            want = choice[i + 1]
        return path, want
    cur = -1
    while True:
        nxt = next(
            (
                i
                for i, (t, p) in enumerate(zip(tokens, parents, strict=True))
                if p == cur and t == want
            ),
            None,
        )
        if nxt is None:
            return path, want
        path.append(nxt)
        cur, want = nxt, choice[nxt + 1]
