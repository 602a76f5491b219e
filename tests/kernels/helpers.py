"""Shared helpers for the verification tests: random trees and a chi-square bound."""

from __future__ import annotations

import math

import numpy as np


def random_parents(n: int, rng: np.random.Generator) -> list[int]:
    """A random tree of `n` nodes in topological order (parents[j] < j)."""
    return [-1] + [int(rng.integers(0, j)) for j in range(1, n)]


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty upper quantile of chi2(df); z = 3.719 is the one-sided 1e-4 level."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi2_stat(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson statistic and degrees of freedom over the categories with mass.

    Categories with zero probability must have zero counts (asserted by the caller)."""
    n = counts.sum()
    keep = probs > 0
    expected = probs[keep] * n
    stat = float((((counts[keep] - expected) ** 2) / expected).sum())
    return stat, int(keep.sum()) - 1
