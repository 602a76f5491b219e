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
LANE_FROM = 1024  # positions beyond which a row moves out of the dense block to a lane


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

    Short rows share one dense block per layer, (slots, H, S, D): a read of the rows a
    segment covers is a slice or a gather of it. The block holds only the slots in use so
    far (grown by doubling, all `capacity` of them at once where reads are padded) and only
    the positions its rows reach, up to `lane_from`. A row that reaches further moves to a
    lane of its own, (1, H, S_row, D) per layer, grown by half again each time it fills: one
    long prompt neither sizes every slot of the batch to its length nor widens the other
    rows' attention (the scorer gives a lane row a segment of its own), and growing it
    copies that row alone.

    Args:
        num_layers: layers of the model the cache belongs to.
        capacity: row slots.
        pad: read widths are rounded up to a multiple of this (0/1 = exact).
        lane_from: positions beyond which a row moves to a lane of its own.
    """

    def __init__(
        self, num_layers: int, capacity: int, pad: int | None = None, lane_from: int = LANE_FROM
    ):
        self.num_layers = num_layers
        self.capacity = capacity
        self.pad = kv_pad() if pad is None else pad
        self.lane_from = max(bucket(lane_from, self.pad), STEP)
        self.lengths = np.zeros(capacity, dtype=np.int64)
        self.keys: list[mx.array | None] = [None] * num_layers  # (slots, H, S, D)
        self.values: list[mx.array | None] = [None] * num_layers
        self.size = 0  # positions allocated per row of the dense block
        self.slots = capacity if self.pad > 1 else 0  # rows allocated in the dense block
        # slot -> its lane: per layer (keys, values), each (1, H, S_row, D), and S_row
        self.lanes: dict[int, list[tuple[mx.array, mx.array]]] = {}
        self.lane_size: dict[int, int] = {}

    # -- shape ------------------------------------------------------------------------

    def read_width(self, end: int) -> int:
        """Key positions a read covers when the furthest row ends at `end`."""
        return bucket(end, self.pad)

    def prepare(self, rows, ends) -> None:
        """Make room for rows `rows` to hold positions up to `ends` (their reach this
        forward): rows reaching past `lane_from` move to (or grow) their lanes, the dense
        block grows to hold the others' slots and positions."""
        dense_end = 0
        hi = 0
        for r, e in zip(rows, ends, strict=True):
            r, e = int(r), int(e)
            if r in self.lanes and self.lengths[r] == 0 and e <= self.lane_from:
                self.release(r)  # a new short row in the slot of a finished long one
            if r in self.lanes or e > self.lane_from:
                self._lane_room(r, e)
            else:
                dense_end = max(dense_end, e)
                hi = max(hi, r + 1)
        self._grow_slots(hi)
        self.reserve(dense_end)

    def reserve(self, end: int) -> None:
        """Make room for positions [0, read_width(end)) in every row of the dense block
        (grows by copying it)."""
        need = self.read_width(end)
        if need <= self.size:
            return
        new = min(-(-need // STEP) * STEP, max(self.lane_from, need))
        self._resize(self.slots, new)

    def _grow_slots(self, hi: int) -> None:
        if hi <= self.slots:
            return
        self._resize(min(self.capacity, max(1 << (hi - 1).bit_length(), 8)), self.size)

    def _resize(self, slots: int, size: int) -> None:
        for i in range(self.num_layers):
            for arrays in (self.keys, self.values):
                a = arrays[i]
                if a is not None and (a.shape[0], a.shape[2]) != (slots, size):
                    grown = mx.zeros((slots, a.shape[1], size, a.shape[3]), a.dtype)
                    n, m = min(a.shape[0], slots), min(a.shape[2], size)
                    grown[:n, :, :m] = a[:n, :, :m]
                    arrays[i] = grown
        self.slots, self.size = slots, size

    def _lane_room(self, r: int, end: int) -> None:
        """Row r's lane holds positions [0, read_width(end)) (made from its dense positions
        the first time, grown by half again after)."""
        need = self.read_width(end)
        have = self.lane_size.get(r, 0)
        if need <= have:
            return
        new = bucket(max(need, have + have // 2), STEP)
        n = int(self.lengths[r])
        lane = []
        for i in range(self.num_layers):
            pair = []
            for j, arrays in enumerate((self.keys, self.values)):
                if r in self.lanes:
                    src = self.lanes[r][i][j]
                elif arrays[i] is not None and r < self.slots:
                    src = arrays[i][r : r + 1]
                else:
                    src = None
                if src is None:
                    pair.append(None)
                    continue
                a = mx.zeros((1, src.shape[1], new, src.shape[3]), src.dtype)
                m = min(n, src.shape[2])
                if m:
                    a[:, :, :m] = src[:, :, :m]
                pair.append(a)
            lane.append(tuple(pair))
        mx.eval([a for pair in lane for a in pair if a is not None])
        self.lanes[r] = lane
        self.lane_size[r] = new

    def release(self, slot: int) -> None:
        """Row `slot` is finished: its lane (if any) is freed and its length is 0."""
        self.lanes.pop(slot, None)
        self.lane_size.pop(slot, None)
        self.lengths[slot] = 0

    def is_lane(self, slot: int) -> bool:
        return slot in self.lanes

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.state())

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
        """Store token t's K/V at (rows[t], slots[t]) of `layer` in the dense block:
        keys/values (N, H, D)."""
        if self.keys[layer] is None:
            self._first(layer, keys, values)
        self.keys[layer][rows, :, slots] = keys
        self.values[layer][rows, :, slots] = values

    def write_lane(
        self, layer: int, row: int, start: int, keys: mx.array, values: mx.array
    ) -> None:
        """Store n tokens' K/V (n, H, D) at positions [start, start + n) of row's lane."""
        if self.keys[layer] is None:
            self._first(layer, keys, values)
        lane = self.lanes[row]
        k, v = lane[layer]
        if k is None:
            _, H, D = keys.shape
            k = mx.zeros((1, H, self.lane_size[row], D), keys.dtype)
            v = mx.zeros((1, H, self.lane_size[row], values.shape[2]), values.dtype)
        n = keys.shape[0]
        k[0, :, start : start + n] = keys.swapaxes(0, 1)
        v[0, :, start : start + n] = values.swapaxes(0, 1)
        lane[layer] = (k, v)

    def _first(self, layer: int, keys: mx.array, values: mx.array) -> None:
        _, H, D = keys.shape
        self.keys[layer] = mx.zeros((self.slots, H, self.size, D), keys.dtype)
        self.values[layer] = mx.zeros((self.slots, H, self.size, values.shape[2]), values.dtype)

    def read(self, layer: int, rows: mx.array | int, width: int) -> tuple[mx.array, mx.array]:
        """Keys and values (R, H, width, D) of `rows` in the dense block: slots gathered by
        index, or an int n for the first n slots (a slice, no gather)."""
        k, v = self.keys[layer], self.values[layer]
        if isinstance(rows, int):
            return k[:rows, :, :width], v[:rows, :, :width]
        return k[rows, :, :width], v[rows, :, :width]

    def read_lane(self, layer: int, row: int, width: int) -> tuple[mx.array, mx.array]:
        """Keys and values (1, H, width, D) of a lane row."""
        k, v = self.lanes[row][layer]
        return k[:, :, :width], v[:, :, :width]

    # -- per-row bookkeeping ----------------------------------------------------------

    def compact(self, rows: list[int], paths: list[list[int]]) -> None:
        """Keep each row's accepted tree path: node path[j] (written at slot length + node)
        moves to slot length + j. `paths[i]` starts at the root (node 0); the caller sets
        the new lengths. Rows whose path is already 0, 1, 2, ... need no move."""
        src, dst, rr = [], [], []
        for r, path in zip(rows, paths, strict=True):
            base = int(self.lengths[r])
            if r in self.lanes:
                self._compact_lane(r, [base + n for n in path], base)
                continue
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

    def _compact_lane(self, r: int, positions: list[int], base: int) -> None:
        if positions == list(range(base, base + len(positions))):
            return
        idx = mx.array(positions)
        lane = self.lanes[r]
        for i, (k, v) in enumerate(lane):
            if k is None:
                continue
            mk, mv = _detached([k[:, :, idx], v[:, :, idx]])
            k[:, :, base : base + len(positions)] = mk
            v[:, :, base : base + len(positions)] = mv
            lane[i] = (k, v)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Row `dst`'s first `n` positions become row `src`'s (a shared prompt prefix); its
        length becomes `n`."""
        self.copy_prefixes([(src, dst, n)])

    def copy_prefixes(self, copies: list[tuple[int, int, int]]) -> None:
        """`copy_prefix` for several (src, dst, n) at once: one gather and one update per
        layer array for all of the dense block's, not one each. No dst may be a src of the
        same call. Each copies the longest n's positions: those beyond its own n lie beyond
        its length, never read, and its prompt's own tokens are written there next. A copy
        that involves a lane row goes row by row."""
        dense = [c for c in copies if c[0] not in self.lanes and c[2] <= self.lane_from]
        for s, d, n in copies:
            if (s, d, n) not in dense:
                self._copy_row(s, d, n)
        width = max((n for _, _, n in dense), default=0)
        if width:
            self._grow_slots(max(d for _, d, _ in dense) + 1)
            self.reserve(width)
            src = mx.array([s for s, _, _ in dense])
            dst = mx.array([d for _, d, _ in dense])
            pieces = _detached([None if a is None else a[src, :, :width] for a in self._arrays()])
            for a, p in zip(self._arrays(), pieces, strict=True):
                if a is not None:
                    a[dst, :, :width] = p
        for _, d, n in copies:
            self.lengths[d] = n

    def _copy_row(self, s: int, d: int, n: int) -> None:
        """Row d's first n positions become row s's, either of them in a lane."""
        self.release(d)
        self.prepare([d], [n])
        for i in range(self.num_layers):
            if self.keys[i] is None:
                continue
            if s in self.lanes:
                k, v = self.read_lane(i, s, n)
            else:
                k, v = self.read(i, mx.array([s]), n)
            k, v = _detached([k, v])
            if d in self.lanes:
                self.write_lane(i, d, 0, k[0].swapaxes(0, 1), v[0].swapaxes(0, 1))
            else:
                self.keys[i][d : d + 1, :, :n] = k
                self.values[i][d : d + 1, :, :n] = v

    def _arrays(self) -> list[mx.array | None]:
        return self.keys + self.values

    def state(self) -> list[mx.array]:
        lanes = [a for lane in self.lanes.values() for pair in lane for a in pair]
        return [a for a in self._arrays() + lanes if a is not None]


def _detached(views: list[mx.array | None]) -> list[mx.array | None]:
    """Copies of slices of the cache, evaluated: an update in place whose source is a view
    of the very array it updates cannot run in place, and MLX then copies the whole layer,
    every slot of it, once per update (docs/decisions.md)."""
    out = [None if v is None else v + 0 for v in views]
    mx.eval([o for o in out if o is not None])
    return out
