"""The machine's verify-cost curve: how long the target takes to forward w tokens at once.

Speculation pays only where verifying w tokens costs much less than w single steps. The
curve is measured, not assumed: on this 2-core CPU (float32 + OpenBLAS) 8 tokens cost ~1.7x
one token; on an H200 32 tokens cost about one. Draft length and tree size are chosen from it.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from .forward import forward, make_cache, trim

WIDTHS = (1, 2, 4, 8, 16)


@dataclass
class CostCurve:
    """Milliseconds to verify w tokens, interpolated between the measured widths."""

    widths: tuple[int, ...]
    ms: tuple[float, ...]

    def __call__(self, w: int) -> float:
        ws, ms = self.widths, self.ms
        if w <= ws[0]:
            return ms[0]
        i = next((j for j in range(1, len(ws)) if w <= ws[j]), len(ws) - 1)
        # Linear between measured widths; beyond the last one, the last slope continues.
        return ms[i - 1] + (ms[i] - ms[i - 1]) * (w - ws[i - 1]) / (ws[i] - ws[i - 1])

    def relative(self, w: int) -> float:
        """Cost of verifying w tokens in units of one plain decoding step."""
        return self(w) / self.ms[0]

    @classmethod
    def flat(cls) -> CostCurve:
        """An accelerator-like curve (width is free): for tests and as a GPU prior."""
        return cls(WIDTHS, tuple(1.0 for _ in WIDTHS))


def measure_verify_curve(
    model: nn.Module,
    widths: Sequence[int] = WIDTHS,
    context: int = 128,
    repeats: int = 3,
) -> CostCurve:
    """Time the target forwarding w tokens after a `context`-token prefix (best of repeats,
    made non-decreasing in w)."""
    vocab = model.model.embed_tokens.weight.shape[0]
    cache = make_cache(model)
    prefix = mx.random.randint(0, vocab, (1, context), key=mx.random.key(0))
    mx.eval(forward(model, prefix, cache))
    out = []
    for w in widths:
        toks = mx.random.randint(0, vocab, (1, w), key=mx.random.key(w))
        mx.eval(forward(model, toks, cache))  # warm-up for this shape
        trim(cache, w)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            mx.eval(forward(model, toks, cache))
            times.append(time.perf_counter() - t0)
            trim(cache, w)
        out.append(1000 * min(times))  # the least-disturbed run: other load only adds time
    # Verifying more tokens never costs less; noise must not make the curve dip.
    for i in range(1, len(out)):
        out[i] = max(out[i], out[i - 1])
    return CostCurve(tuple(widths), tuple(out))
