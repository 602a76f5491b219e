"""Rows' kept states by reference: a gather over many rows' spans equals slicing and
concatenating them row by row, and the spans of one whole step come back as that step's
array itself (no operation queued)."""

import mlx.core as mx

from core.engine.states import Span, count, gather


def test_a_gather_equals_slicing_each_span_in_order():
    a = mx.arange(4 * 3, dtype=mx.float32).reshape(4, 3)  # a plain step: one state per row
    b = 100 + mx.arange(5 * 3, dtype=mx.float32).reshape(5, 3)  # a verify step's committed ones
    rows = [
        [Span(a, 0, 1), Span(b, 0, 2)],
        [Span(a, 2, 1)],
        [Span(b, 2, 3), Span(a, 3, 1)],
    ]
    spans = [s for r in rows for s in r]
    want = mx.concatenate([s.src[s.start : s.start + s.count] for s in spans])
    assert count(spans) == want.shape[0] == 8
    assert mx.array_equal(gather(spans), want).item()


def test_a_whole_step_in_order_is_that_steps_array():
    h = mx.ones((6, 2))
    assert gather([Span(h, 0, 2), Span(h, 2, 1), Span(h, 3, 3)]) is h
