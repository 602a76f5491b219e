"""What a batch's rows cost in memory, and the budget they must fit.

A row's keys and values take `bytes_per_position` for each position it may reach: its
prompt, its `max_tokens` and the longest draft verified past them. Rows up to the cache's
`lane_from` positions share the dense block, which is as long as its longest row; longer
rows each hold a lane of their own (cache.py). Admission (`Admission.fits`) keeps the sum in
the budget; a request that cannot fit alone is refused when it is submitted.

Prompts are prefilled in chunks of at most `Engine.prefill_tokens`, and the CPU's attention
runs a chunk's queries in blocks (`cpu_math.attention`; Metal's and CUDA's kernels do not
hold the scores): peak memory is the weights, the KV cache and a bounded activation term,
whatever the prompt's length.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

from .draft_length import K_MAX

KV_SHARE = 0.5  # of the device's memory, for the KV caches of a worker's batches


class RequestTooLarge(ValueError):
    """A request whose KV cache alone exceeds the budget: it fails before it runs."""


def bytes_per_position(model: nn.Module) -> int:
    """KV bytes one position of one row takes over all layers."""
    args = model.args
    heads = args.num_attention_heads
    kv = getattr(args, "num_key_value_heads", None) or heads
    head_dim = getattr(args, "head_dim", None) or args.hidden_size // heads
    size = 4 if model.model.norm.weight.dtype == mx.float32 else 2
    return 2 * len(model.model.layers) * kv * head_dim * size


def row_positions(prompt: int, max_tokens: int, context: int | None = None) -> int:
    """Positions a row may reach: its prompt, its answer and a draft verified past them."""
    n = prompt + max_tokens + K_MAX + 1
    return n if context is None else min(n, context + K_MAX + 1)


def kv_bytes(positions: list[int], lane_from: int, per_position: int) -> int:
    """KV bytes of rows reaching `positions`: the dense block (rows x its longest) and the
    lanes of the rows beyond `lane_from`."""
    dense = [n for n in positions if n <= lane_from]
    lanes = sum(n for n in positions if n > lane_from)
    return (len(dense) * max(dense, default=0) + lanes) * per_position


def device_memory() -> int:
    """Bytes of memory the default device has (a GPU's own, else the machine's)."""
    if mx.default_device() == mx.gpu:
        try:
            info = mx.device_info()
            size = info.get("max_recommended_working_set_size") or info.get("memory_size")
            if size:
                return int(size)
        except (AttributeError, RuntimeError, ValueError):
            pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def kv_budget(share: float = KV_SHARE) -> int:
    """The KV budget of a batch: `share` of the device's memory less what MLX holds now
    (the weights), at least 256 MiB."""
    return max(int(share * device_memory()) - mx.get_active_memory(), 256 * 2**20)
