"""Stored adapters: small safetensors files under `APPLESPEC_HOME/adapters/`.

One file per calibration, `adapters/<model key>/<kind>-L<layer>-<time>.safetensors`, holding
the trained weights only (the frozen parts are the target's own) and, in its metadata, the
model it was trained for, its kind and layer, and its measured held-out agreement. The best
stored adapter is the one whose measured agreement promises the most tokens per unit of time
(`promise`): a deeper layer agrees more and costs more per draft token, so the choice of L
comes from measurements (its agreement, the share of the target a draft token runs, and the
machine's verify-cost surface when the caller has one), not from a fixed rule.

The model key is a fingerprint of the target's shape and of a few of its embedding values,
so an adapter made for another model (or another checkpoint of the same shape) is refused.
Loading validates everything (readable file, format, model key, names and shapes of the
weights, finite values) and raises `AdapterError` (a ValueError) with a clear message; the
registry then falls back to the other drafters (`auto`) or reports it (`--draft adapter`).
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from core.models import LoadedModel

from ..costs import data_dir
from ..draft_length import best_length
from .block import KIND, Adapter, new_adapter, weight_share
from .head import KIND as HEAD
from .head import new_head_adapter
from .head import weight_share as head_share

FORMAT = "applespec-adapter/1"
VOCAB = "draft_vocab"  # the reduced draft vocabulary's token ids, when there is one
KINDS = (KIND, HEAD)  # an early-exit adapter, a feature head
HINT = "run `applespec calibrate --model {model} --data PROMPTS.jsonl` to train one"


class AdapterError(ValueError):
    """An adapter that cannot be used: none stored, unreadable, or made for another model."""


def adapters_dir() -> Path:
    return data_dir() / "adapters"


def model_key(target: LoadedModel) -> str:
    """What an adapter is valid for: the model's shape and a few of its embedding values
    (rounded to float16, so a float32 copy and a float16 copy of one checkpoint agree)."""
    args = getattr(target.model, "args", None)
    shape = json.dumps(vars(args), sort_keys=True, default=str) if args is not None else ""
    probe = target.model.model.embed_tokens(mx.array([0, 1, 2, 3]))
    values = probe.astype(mx.float16)
    mx.eval(values)
    digest = hashlib.sha256(shape.encode() + bytes(memoryview(values)))
    return digest.hexdigest()[:16]


def save(target: LoadedModel, adapter: Adapter, meta: dict | None = None) -> Path:
    """Write `adapter` for `target`; returns its path. `meta` adds facts (agreement, ...)."""
    key = model_key(target)
    info = {**adapter.meta, **(meta or {})}
    info.update(
        format=FORMAT,
        model_key=key,
        model=target.name,
        kind=adapter.kind,
        layer=adapter.layer,
        params=adapter.size(),
    )
    folder = adapters_dir() / key
    folder.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.6f}"[1:]
    path = folder / f"{adapter.kind}-L{adapter.layer}-{stamp}.safetensors"
    tmp = path.with_suffix(".tmp.safetensors")
    weights = {k: v.astype(mx.float32) for k, v in adapter.trainable().items()}
    if adapter.vocab is not None:
        weights[VOCAB] = adapter.vocab.astype(mx.int32)
        info["vocab_size"] = int(adapter.vocab.size)
    mx.save_safetensors(str(tmp), weights, metadata={k: json.dumps(v) for k, v in info.items()})
    tmp.replace(path)
    adapter.meta = info
    return path


def read_meta(path: Path) -> dict:
    """A file's metadata from its safetensors header, without reading the weights.

    Raises:
        AdapterError: not a readable safetensors file or not an adapter of ours.
    """
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if not 0 < size < 1 << 24:
                raise ValueError(f"header size {size}")
            header = json.loads(f.read(size))
        raw = header.get("__metadata__") or {}
        meta = {k: json.loads(v) for k, v in raw.items()}
    except (OSError, ValueError, struct.error, UnicodeDecodeError, AttributeError) as e:
        raise AdapterError(f"{path}: not a readable adapter file ({e})") from e
    if meta.get("format") != FORMAT:
        raise AdapterError(f"{path}: not an applespec adapter (format {meta.get('format')!r})")
    return meta


_WEIGHTS: dict[tuple, dict[str, mx.array]] = {}  # (path, mtime, size) -> weights


def load(path: Path | str, target: LoadedModel) -> Adapter:
    """The adapter stored at `path`, for `target`.

    Raises:
        AdapterError: unreadable or corrupt, made for another model, or its weights do not
            fit the target (names, shapes, non-finite values).
    """
    path = Path(path)
    meta = read_meta(path)
    key = model_key(target)
    if meta.get("model_key") != key:
        raise AdapterError(
            f"{path} was made for model {meta.get('model')!r} (key {meta.get('model_key')}), "
            f"not for {target.name!r} (key {key})"
        )
    layer, kind = meta.get("layer"), meta.get("kind")
    if kind not in KINDS or not isinstance(layer, int):
        raise AdapterError(f"{path}: unknown adapter kind {kind!r}")
    try:
        if kind == HEAD:
            if layer != target.num_layers:
                raise ValueError(
                    f"a feature head after layer {layer}, the target has {target.num_layers}"
                )
            adapter = new_head_adapter(target.model)
        else:
            adapter = new_adapter(target.model, layer)
    except ValueError as e:
        raise AdapterError(f"{path}: {e}") from e
    stat = path.stat()
    memo = (str(path), stat.st_mtime_ns, stat.st_size)
    weights = _WEIGHTS.get(memo)
    if weights is None:
        try:
            weights = mx.load(str(path))
            mx.eval(list(weights.values()))
        except Exception as e:  # MLX raises RuntimeError/ValueError for truncated files
            raise AdapterError(f"{path}: corrupt adapter file ({e})") from e
        want = adapter.trainable()
        vocab = weights.get(VOCAB)
        if vocab is not None:
            V = target.vocab_size
            if vocab.ndim != 1 or vocab.dtype != mx.int32 or not 0 < vocab.size <= V:
                raise AdapterError(f"{path}: corrupt draft vocabulary")
            if vocab.min().item() < 0 or vocab.max().item() >= V:
                raise AdapterError(f"{path}: draft vocabulary outside {target.name!r}'s {V} tokens")
            want = {**want, VOCAB: vocab}
        if set(weights) != set(want):
            missing, extra = sorted(set(want) - set(weights)), sorted(set(weights) - set(want))
            raise AdapterError(
                f"{path}: weights do not fit {target.name!r} (missing {missing[:3]}, "
                f"unexpected {extra[:3]})"
            )
        for name, v in weights.items():
            if v.shape != want[name].shape:
                raise AdapterError(
                    f"{path}: {name} has shape {tuple(v.shape)}, "
                    f"{target.name!r} needs {tuple(want[name].shape)}"
                )
        floats = [v for k, v in weights.items() if k != VOCAB]
        if not all(mx.isfinite(v).all().item() for v in floats):
            raise AdapterError(f"{path}: corrupt adapter file (non-finite weights)")
        _WEIGHTS.clear()  # keep one file's weights: the one in use
        _WEIGHTS[memo] = weights
    dtype = target.model.model.norm.weight.dtype
    adapter.block.load_weights(
        [(k, v.astype(dtype)) for k, v in weights.items() if k != VOCAB], strict=False
    )
    adapter.vocab = weights.get(VOCAB)
    adapter.meta = meta
    return adapter


def stored(
    target: LoadedModel, layer: int | None = None, kind: str | None = None
) -> list[tuple[dict, Path]]:
    """Readable adapters stored for `target` (at `layer`, of `kind`, if given), best
    agreement first. Unreadable files are skipped here; `load` says what is wrong with one."""
    folder = adapters_dir() / model_key(target)
    out = []
    for path in sorted(folder.glob("*.safetensors")) if folder.is_dir() else []:
        if path.name.endswith(".tmp.safetensors"):
            continue
        try:
            meta = read_meta(path)
        except AdapterError:
            continue
        if (layer is None or meta.get("layer") == layer) and kind in (None, meta.get("kind")):
            out.append((meta, path))
    out.sort(key=lambda mp: -float(mp[0].get("agreement", 0.0)))
    return out


def promise(
    target: LoadedModel, meta: dict, verify_cost: Callable[[int], float] | None = None
) -> tuple[int, float]:
    """(k, speedup): the draft length that pays most for a stored adapter and the speedup
    over plain steps it promises, from its measured held-out agreement, the share of the
    target's weights one of its draft tokens reads, and `verify_cost(w)` (a step verifying w
    tokens per row, in plain steps; default: free width, an accelerator at batch 1)."""
    layer = meta.get("layer")
    a = min(max(float(meta.get("agreement", 0.0)), 0.0), 1.0)
    if meta.get("kind") == HEAD:
        return best_length(a, head_share(target.model, meta.get("vocab_size")), verify_cost)
    if not isinstance(layer, int) or not 0 < layer < target.num_layers:
        return 0, 0.0
    share = weight_share(target.model, layer, meta.get("vocab_size"))
    a = min(max(float(meta.get("agreement", 0.0)), 0.0), 1.0)
    return best_length(a, share, verify_cost)


def best(
    target: LoadedModel,
    layer: int | None = None,
    verify_cost: Callable[[int], float] | None = None,
    kind: str | None = None,
) -> Adapter:
    """The stored adapter for `target` (at `layer`, of `kind`, if given) that promises the
    most speedup (`promise`; the higher agreement breaks ties, as when none pays) and
    loads; raises AdapterError naming `applespec calibrate` when there is none."""
    errors = []
    ranked = sorted(
        stored(target, layer, kind), key=lambda mp: -promise(target, mp[0], verify_cost)[1]
    )
    for _, path in ranked:
        try:
            return load(path, target)
        except AdapterError as e:
            errors.append(str(e))
    where = f" at layer {layer}" if layer is not None else ""
    if kind == HEAD:
        where, layer = " (feature head)", "head"
    hint = HINT.format(model=target.name) + (f" --exit-layer {layer}" if layer else "")
    why = f" ({errors[0]})" if errors else ""
    raise AdapterError(
        f"no usable adapter stored for {target.name!r}{where} under {adapters_dir()}{why}; {hint}"
    )
