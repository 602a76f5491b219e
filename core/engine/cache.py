"""A KV cache for a batch of sequences with per-row lengths.

Every layer holds keys and values for `capacity` row slots, (slots, H, S, D) like mlx-lm's
caches. Row r's committed tokens sit at positions [0, lengths[r]); a forward writes its new
tokens at per-row positions (`write`: a scatter, in place), attention reads the first
`width` positions of the rows it covers and a mask derived from the lengths hides the rest.
So a row's rollback after rejected drafts is lowering its length (no copies), a finished
row frees its slot by setting its length to 0, and a token tree keeps its accepted path by
a per-row gather (`compact`). mlx-lm's `BatchKVCache` left-pads and trims every row by one
number, which cannot express per-row acceptance.

On MLX's CUDA backend attention over several queries runs through cuDNN graphs built for,
and cached by, the exact key length (LRU of 128); reads are padded to a multiple of
`kv_pad()` positions there so a verify step meets a handful of lengths, not a new one
almost every step (masked, so the output is the same).
"""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np

STEP = 256  # positions added per growth (mlx-lm's KVCache step)


def kv_pad() -> int:
    """Attention reads cover a multiple of this many positions (see the module docstring).

    64 on the CUDA backend, 0 (no padding) on Metal and the CPU; `APPLESPEC_KV_PAD`
    overrides (tests force padding on the CPU to check it changes nothing).
    """
    env = os.environ.get("APPLESPEC_KV_PAD")
    if env is not None:
        if not env.strip().isdigit():
            raise ValueError(f"APPLESPEC_KV_PAD must be a whole number of positions, got {env!r}")
        return int(env)
    return 64 if mx.default_device() == mx.gpu and mx.cuda.is_available() else 0


def bucket(n: int, pad: int) -> int:
    """`n` rounded up to a multiple of `pad` (pad <= 1: `n`): the few shapes a backend that
    builds a graph per exact shape then meets."""
    return -(-n // pad) * pad if pad > 1 else n


def bucket_rows(n: int, pad: int) -> int:
    """`n` rows rounded up to a power of two when `pad` > 1 (as `bucket`)."""
    return 1 << (n - 1).bit_length() if pad > 1 else n


class BatchKVCache:
    """Per-layer keys/values of `capacity` rows with per-row lengths (host-side ints).

    Args:
        num_layers: layers of the model the cache belongs to.
        capacity: row slots.
        pad: read widths are rounded up to a multiple of this (0/1 = exact).
    """

    def __init__(self, num_layers: int, capacity: int, pad: int | None = None):
        self.num_layers = num_layers
        self.capacity = capacity
        self.pad = kv_pad() if pad is None else pad
        self.lengths = np.zeros(capacity, dtype=np.int64)
        self.keys: list[mx.array | None] = [None] * num_layers  # (slots, H, S, D)
        self.values: list[mx.array | None] = [None] * num_layers
        self.size = 0  # positions allocated per row

    # -- shape ------------------------------------------------------------------------

    def read_width(self, end: int) -> int:
        """Key positions a read covers when the furthest row ends at `end`."""
        return bucket(end, self.pad)

    def reserve(self, end: int) -> None:
        """Make room for positions [0, read_width(end)) in every row (grows by copying)."""
        need = self.read_width(end)
        if need <= self.size:
            return
        new = -(-need // STEP) * STEP
        for i in range(self.num_layers):
            for arrays in (self.keys, self.values):
                a = arrays[i]
                if a is not None:
                    grown = mx.zeros((a.shape[0], a.shape[1], new, a.shape[3]), a.dtype)
                    grown[:, :, : self.size] = a[:, :, : self.size]
                    arrays[i] = grown
        self.size = new

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys + self.values if a is not None)

    def bytes_per_position(self) -> int | None:
        """Bytes one position of one row takes over all layers (None before the first write)."""
        if self.keys[0] is None:
            return None
        k, v = self.keys[0], self.values[0]
        per = (k.shape[1] * k.shape[3] * k.itemsize) + (v.shape[1] * v.shape[3] * v.itemsize)
        return per * self.num_layers

    # -- one layer's reads and writes -------------------------------------------------

    def write(
        self, layer: int, rows: mx.array, slots: mx.array, keys: mx.array, values: mx.array
    ) -> None:
        """Store token t's K/V at (rows[t], slots[t]) of `layer`: keys/values (N, H, D)."""
        if self.keys[layer] is None:
            _, H, D = keys.shape
            self.keys[layer] = mx.zeros((self.capacity, H, self.size, D), keys.dtype)
            self.values[layer] = mx.zeros(
                (self.capacity, H, self.size, values.shape[2]), values.dtype
            )
        self.keys[layer][rows, :, slots] = keys
        self.values[layer][rows, :, slots] = values

    def read(self, layer: int, rows: mx.array | int, width: int) -> tuple[mx.array, mx.array]:
        """Keys and values (R, H, width, D) of `rows`: slots gathered by index, or an int n
        for the first n slots (a slice, no gather)."""
        k, v = self.keys[layer], self.values[layer]
        if isinstance(rows, int):
            return k[:rows, :, :width], v[:rows, :, :width]
        return k[rows, :, :width], v[rows, :, :width]

    # -- per-row bookkeeping ----------------------------------------------------------

    def compact(self, rows: list[int], paths: list[list[int]]) -> None:
        """Keep each row's accepted tree path: node path[j] (written at slot length + node)
        moves to slot length + j. `paths[i]` starts at the root (node 0); the caller sets
        the new lengths. Rows whose path is already 0, 1, 2, ... need no move."""
        src, dst, rr = [], [], []
        for r, path in zip(rows, paths, strict=True):
            base = int(self.lengths[r])
            for j, node in enumerate(path):
                if node != j:
                    rr.append(r)
                    src.append(base + node)
                    dst.append(base + j)
        if not rr:
            return
        r_a, s_a, d_a = mx.array(rr), mx.array(src), mx.array(dst)
        moved = _detached([None if a is None else a[r_a, :, s_a] for a in self._arrays()])
        for a, m in zip(self._arrays(), moved, strict=True):
            if a is not None:
                a[r_a, :, d_a] = m

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Row `dst`'s first `n` positions become row `src`'s (a shared prompt prefix); its
        length becomes `n`."""
        self.copy_prefixes([(src, dst, n)])

    def copy_prefixes(self, copies: list[tuple[int, int, int]]) -> None:
        """`copy_prefix` for several (src, dst, n) at once: one gather and one update per
        layer array for all of them, not one each. No dst may be a src of the same call.
        Each copies the longest n's positions: those beyond its own n lie beyond its length,
        never read, and its prompt's own tokens are written there next."""
        width = max((n for _, _, n in copies), default=0)
        if width:
            src = mx.array([s for s, _, _ in copies])
            dst = mx.array([d for _, d, _ in copies])
            pieces = _detached([None if a is None else a[src, :, :width] for a in self._arrays()])
            for a, p in zip(self._arrays(), pieces, strict=True):
                if a is not None:
                    a[dst, :, :width] = p
        for _, d, n in copies:
            self.lengths[d] = n

    def _arrays(self) -> list[mx.array | None]:
        return self.keys + self.values

    def state(self) -> list[mx.array]:
        return [a for a in self._arrays() if a is not None]


def _detached(views: list[mx.array | None]) -> list[mx.array | None]:
    """Copies of slices of the cache, evaluated: an update in place whose source is a view
    of the very array it updates cannot run in place, and MLX then copies the whole layer,
    every slot of it, once per update (measured on this CPU: 194 ms per prompt-prefix copy
    at 64 slots, 369 ms at 128; 4 ms this way)."""
    out = [None if v is None else v + 0 for v in views]
    mx.eval([o for o in out if o is not None])
    return out
