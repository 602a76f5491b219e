"""The machine's verify-cost surface: how long one forward of B rows x W tokens takes.

Speculation in a batch pays only where verifying more tokens per row costs less than it
returns, and that depends on the machine and the batch size: where a step is bound by
latency (a small model on a GPU, at small batches) more tokens per row cost almost nothing,
where it is bound by compute (a CPU at large batches) each costs nearly a row's step.
So the cost is measured on this machine, at (batch size, tokens per row), once per machine
and model, and kept under the data directory (`APPLESPEC_HOME`); every draft length and
batch size is chosen from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .cache import BatchKVCache
from .scorer import VERSION as FORWARD_VERSION
from .scorer import Segment, forward

BATCHES = (1, 4, 16, 64, 128)
GPU_BATCHES = (1, 4, 16, 64, 128, 256)
WIDTHS = (1, 2, 4, 8)
CONTEXT = 160  # cached positions per row while measuring (a prompt and part of an answer)


@dataclass
class CostSurface:
    """Milliseconds of one forward of B rows x W tokens, interpolated between the grid.

    Attributes:
        batches: measured batch sizes (increasing).
        widths: measured tokens per row (increasing).
        ms: (len(batches), len(widths)) milliseconds.
    """

    batches: tuple[int, ...]
    widths: tuple[int, ...]
    ms: tuple[tuple[float, ...], ...]

    def __call__(self, rows: int, tokens: float) -> float:
        """Milliseconds for `rows` rows and `tokens` tokens in all (tokens / rows per row)."""
        return float(self.at(rows)(np.asarray([tokens], float))[0])

    def at(self, rows: int):
        """The cost in ms of `rows` rows as a function of (T,) total token counts."""
        rows = max(rows, 1)
        grid = np.asarray(self.ms)
        i, j, f = _interp_axis(np.log2(np.asarray(self.batches, float)), np.log2(rows))
        per_width = (1 - f) * grid[i] + f * grid[j]
        # Beyond the measured range the last slope continues (linear in rows / width).
        scale = rows / self.batches[-1] if rows > self.batches[-1] else 1.0
        ws = np.asarray(self.widths, float)

        def cost(tokens: np.ndarray) -> np.ndarray:
            return _interp_linear(ws, per_width, np.maximum(tokens / rows, 1.0)) * scale

        return cost

    def relative(self, rows: int, tokens: float) -> float:
        """Cost in units of one plain step (one token per row) at this batch size."""
        return self(rows, tokens) / self(rows, rows)

    def verify_cost(self, rows: int) -> Callable[[int], float]:
        """A step's cost at `rows` rows as a function of its tokens per row, in plain steps
        (what `draft_length.best_length` prices a draft length with)."""
        return lambda width: self.relative(rows, rows * width)

    def plain_throughput(self, rows: int) -> float:
        """Tokens per millisecond of plain decoding at `rows` rows."""
        return rows / self(rows, rows)

    def best_batch(self, limit: int, within: float = 0.05) -> int:
        """The smallest batch size whose plain throughput is within `within` of the best
        measured one (more rows cost memory and latency for little gain)."""
        sizes = [b for b in self.batches if b <= limit] or [self.batches[0]]
        best = max(self.plain_throughput(b) for b in sizes)
        return next(b for b in sizes if self.plain_throughput(b) >= (1 - within) * best)

    def merged(self, other: CostSurface) -> CostSurface:
        """This surface with `other`'s batch sizes added (other's rows win; same widths),
        made non-decreasing in B again."""
        if tuple(other.widths) != tuple(self.widths):
            return other
        rows = dict(zip(self.batches, self.ms, strict=True))
        rows.update(zip(other.batches, other.ms, strict=True))
        batches = tuple(sorted(rows))
        g = np.maximum.accumulate(np.asarray([rows[b] for b in batches]), axis=0)
        return CostSurface(batches, self.widths, tuple(tuple(map(float, r)) for r in g))

    @classmethod
    def flat(cls) -> CostSurface:
        """An accelerator-like surface (width and rows are free): for tests."""
        return cls(BATCHES, WIDTHS, tuple(tuple(1.0 for _ in WIDTHS) for _ in BATCHES))

    def to_json(self) -> dict:
        return {
            "batches": list(self.batches),
            "widths": list(self.widths),
            "ms": [list(r) for r in self.ms],
        }

    @classmethod
    def from_json(cls, d: dict) -> CostSurface:
        return cls(tuple(d["batches"]), tuple(d["widths"]), tuple(tuple(r) for r in d["ms"]))


def _interp_axis(xs: np.ndarray, x: float) -> tuple[int, int, float]:
    if x <= xs[0]:
        return 0, 0, 0.0
    if x >= xs[-1]:
        return len(xs) - 1, len(xs) - 1, 0.0
    j = int(np.searchsorted(xs, x))
    return j - 1, j, float((x - xs[j - 1]) / (xs[j] - xs[j - 1]))


def _interp_linear(xs: np.ndarray, ys: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Piecewise linear in x; past the last point the last slope continues."""
    out = np.interp(x, xs, ys)
    if len(xs) > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        out = np.where(x > xs[-1], ys[-1] + slope * (x - xs[-1]), out)
    return out


def measure_surface(
    model: nn.Module,
    batches: Sequence[int] = BATCHES,
    widths: Sequence[int] = WIDTHS,
    context: int = CONTEXT,
    repeats: int = 2,
    progress=lambda s: None,
) -> CostSurface:
    """Time forwards of B rows x W tokens after a `context`-token prefix per row (each
    width's best of `repeats` rounds over all widths, `interleaved_ms`; made non-decreasing
    in W and in B)."""
    grid = []
    for b in batches:
        progress(f"verify cost at batch {b}")
        grid.append(interleaved_ms(_forwards(model, b, widths, context), repeats))
    g = np.maximum.accumulate(np.maximum.accumulate(np.asarray(grid), axis=1), axis=0)
    return CostSurface(tuple(batches), tuple(widths), tuple(tuple(map(float, r)) for r in g))


def _forwards(
    model: nn.Module, rows: int, widths: Sequence[int], context: int
) -> list[Callable[[], object]]:
    """A forward of `rows` rows x W tokens for each width, after a `context`-position
    prefix per row on a scratch cache (random tokens, zero keys and values: as good to time,
    and nothing to prefill)."""
    vocab = model.model.embed_tokens.weight.shape[0]
    cache = BatchKVCache(len(model.model.layers), rows)
    slots = list(range(rows))
    cache.lengths[:] = context
    runs = []
    for w in widths:
        toks = np.random.default_rng(w).integers(0, vocab, (rows, w)).tolist()
        seg = [Segment(slots, toks)]
        runs.append(lambda seg=seg: forward(model, cache, seg))
    return runs


def best_ms(
    run: Callable[[], object], repeats: int = 2, clock: Callable[[], float] = time.perf_counter
) -> float:
    """Milliseconds `mx.eval(run())` takes on this machine: once to warm up (kernels and
    attention graphs built for these shapes, work already in flight finished), then the
    best of `repeats` (the least-disturbed run: other load only adds time)."""
    return interleaved_ms([run], repeats, clock=clock)[0]


def interleaved_ms(
    runs: Sequence[Callable[[], object]],
    repeats: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """`best_ms` of each run, timed in `repeats` rounds that run each once in turn (after
    one warm-up each): a burst of other load on a shared machine then slows one round of
    several runs, not every timing of one (a cost timed under load misprices drafts: a
    second token priced below a plain one makes rows decline nearly every draft).
    `clock`: seconds (wall time; tests pass their own)."""
    for run in runs:
        mx.eval(run())
    best = [float("inf")] * len(runs)
    for _ in range(repeats):
        for i, run in enumerate(runs):
            t0 = clock()
            mx.eval(run())
            best[i] = min(best[i], clock() - t0)
    return [1000 * b for b in best]


def data_dir() -> Path:
    """`APPLESPEC_HOME`, default the per-user data directory (`$XDG_DATA_HOME/applespec`)."""
    if env := os.environ.get("APPLESPEC_HOME"):
        return Path(env).expanduser()
    base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "applespec"


def machine_key(model: nn.Module, weight_format: str) -> str:
    """What a measured surface is valid for: the model's shape (not its name: the cost of
    seeds of one architecture is the same), its weight format, this device and host. On an
    accelerator the device's own name counts (`_accelerator`): the host's CPU and core count
    do not tell an M1 from an M4 (macOS reports both as `arm`), nor an H100 from an H200,
    and a farm's machines may keep their surfaces in one shared `APPLESPEC_HOME`."""
    args = getattr(model, "args", None)
    shape = json.dumps(vars(args), sort_keys=True, default=str) if args is not None else ""
    parts = [
        shape,
        weight_format,
        str(mx.default_device()),
        platform.machine(),
        platform.processor() or _cpu_model(),
        str(os.cpu_count()),
        mx.__version__,
        os.environ.get("OPENBLAS_CORETYPE", ""),
        "1" if "libopenblas" in _maps() else "0",
        f"forward-{FORWARD_VERSION}",
    ]
    if mx.default_device() == mx.gpu:
        parts.append(_accelerator())
        if mx.cuda.is_available():
            parts.append("cuda")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _accelerator() -> str:
    """The default GPU's name and memory as MLX reports them ('' where it reports none)."""
    try:
        info = mx.device_info()
    except (AttributeError, RuntimeError, ValueError):
        return ""
    size = info.get("total_memory", info.get("memory_size", ""))
    return f"{info.get('device_name', '')}|{info.get('architecture', '')}|{size}"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def _maps() -> str:
    try:
        return Path("/proc/self/maps").read_text()
    except OSError:
        return ""


def format_surface(surf: dict) -> list[str]:
    """A surface's JSON (`CostSurface.to_json`) as lines of milliseconds."""
    lines = [
        "verify cost surface (ms; rows = batch size, columns = tokens per row "
        + "/".join(map(str, surf["widths"]))
        + "):"
    ]
    for b, ms in zip(surf["batches"], surf["ms"], strict=True):
        lines.append(f"  {b:>4}: " + " ".join(f"{m:8.1f}" for m in ms))
    return lines


def surface_path(model: nn.Module, weight_format: str) -> Path:
    """Where this machine's surface for this model shape and weight format is kept."""
    return data_dir() / "costs" / f"{machine_key(model, weight_format)}.json"


def load_kept(model: nn.Module, weight_format: str) -> CostSurface | None:
    """The kept surface, or None when there is none (or it is damaged)."""
    try:
        return CostSurface.from_json(json.loads(surface_path(model, weight_format).read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def measure_and_keep(
    model: nn.Module, model_name: str, weight_format: str, progress=lambda s: None
) -> CostSurface:
    """Measure the surface now and keep it (replacing any kept one)."""
    on_gpu = mx.default_device() == mx.gpu
    surface = measure_surface(model, GPU_BATCHES if on_gpu else BATCHES, progress=progress)
    _keep(surface, model, model_name, weight_format)
    return surface


def _keep(surface: CostSurface, model: nn.Module, model_name: str, weight_format: str) -> None:
    path = surface_path(model, weight_format)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"model": model_name, **surface.to_json()}))
        tmp.replace(path)
    except OSError:
        pass  # a read-only data directory: measured again next time


def load_or_measure(
    model: nn.Module,
    model_name: str,
    weight_format: str,
    progress=lambda s: None,
    rows: int | None = None,
) -> CostSurface:
    """The surface kept for this machine and model, with the batch sizes a batch of at
    most `rows` rows prices (the grid's up to the first that holds them; None: the whole
    grid) measured and kept first where they are missing, smallest first."""
    grid = GPU_BATCHES if mx.default_device() == mx.gpu else BATCHES
    kept = load_kept(model, weight_format)
    need = list(grid) if rows is None else grid_up_to(grid, rows)
    have = set(kept.batches) if kept is not None else set()
    missing = [b for b in need if b not in have]
    if not missing:
        return kept
    t0 = time.perf_counter()
    progress(
        f"measuring this machine's verify costs for {model_name} at batch sizes "
        f"{', '.join(map(str, missing))} (once; kept for later runs)"
    )
    new = measure_surface(model, missing, progress=progress)
    surface = new if kept is None else kept.merged(new)
    _keep(surface, model, model_name, weight_format)
    progress(f"verify costs measured in {time.perf_counter() - t0:.1f} s")
    return surface


def grid_up_to(grid: Sequence[int], rows: int) -> list[int]:
    """The grid's batch sizes up to the first that holds `rows` rows (all, if none does)."""
    out = []
    for b in grid:
        out.append(b)
        if b >= rows:
            break
    return out
