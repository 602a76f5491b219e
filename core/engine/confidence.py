"""What a drafter's own confidence in a node is worth: how often a node is accepted once its
parent was, per bucket of what the drafter said about it (a suffix continuation's count share
and support, a trained head's probability of its token), counted with a prior.

A drafter that knows which of its nodes are likely hands the draft-length policy a chance per
node instead of its per-position average: where verifying a token costs real time (a
compute-bound step at a large batch), the policy keeps the likely nodes and drops the rest
(EAGLE-2 keeps a head's drafts by their calibrated confidence the same way).
"""

from __future__ import annotations

import numpy as np


class Confidence:
    """Acceptance per bucket (any shape of bucket index), `weight` prior observations each
    at `prior`'s rate."""

    def __init__(self, prior: np.ndarray, weight: float = 4.0):
        prior = np.asarray(prior, dtype=float)
        self.hits = weight * prior
        self.tries = np.full_like(prior, weight)

    def rates(self) -> np.ndarray:
        """Every bucket's acceptance rate."""
        return self.hits / self.tries

    def observe(self, buckets: list, accepted: int) -> None:
        """`buckets` of a chain's nodes verified, in order; the first `accepted` were kept
        (nodes after the first rejected one were not tested on their own merit)."""
        for i, b in enumerate(buckets[: accepted + 1]):
            self.tries[b] += 1
            self.hits[b] += i < accepted


class ProbabilityBins(Confidence):
    """A model drafter's probability of its own token, in `bins` equal bins; the prior takes
    the probability at its word."""

    def __init__(self, bins: int = 10, weight: float = 4.0):
        super().__init__((np.arange(bins) + 0.5) / bins, weight)
        self.bins = bins

    def buckets(self, probs: np.ndarray) -> np.ndarray:
        """The bin of each probability (any shape)."""
        return np.minimum((np.asarray(probs) * self.bins).astype(np.int64), self.bins - 1)

    def chances(self, bins: np.ndarray) -> np.ndarray:
        """(R, K) the bins of a chain's probabilities -> (R, K) each node's chance of being
        accepted with all before it: the product of its and its ancestors' calibrated rates."""
        return np.cumprod(self.rates()[bins], axis=-1)
