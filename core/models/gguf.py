"""GGUF files as mlx-lm models: read tensors and metadata, map names, build the model.

Two readers, one result. A file whose tensors are all F32/F16/Q4_0/Q4_1/Q8_0 goes
through `mx.load` (fast; quantized tensors come back as mlx triples `X.weight`/`X.scales`/
`X.biases`). Any other file (K-quants, Q5_0, BF16, IQ...) is dequantized tensor by tensor
with the `gguf` package (`gguf.quants.dequantize`). The header (metadata, tensor table)
is always read by `read_header` below.

llama.cpp's converter permutes the rows of Q and K for the `llama` architecture so that
its interleaved ("traditional") RoPE works; we undo that so mlx-lm's default RoPE applies.
It does not permute them for `qwen2`.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .model import ModelError

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHS = ("llama", "qwen2")
GROUP = 32  # the block width of the GGUF types mx.load reads (Q4_0, Q4_1, Q8_0)
# ggml types mx.load reads correctly: F32, F16, Q4_0, Q8_0, Q4_1. It also converts some
# K-quants to float16 without an error, but its Q4_K values are wrong (checked against
# gguf.quants.dequantize): every other type goes through the gguf package.
MLX_NATIVE = {0, 1, 2, 3, 8}

# GGUF tensor name stem -> mlx-lm module path (`{n}` is the layer index).
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_SUFFIXES = ("weight", "bias", "scales", "biases")


@dataclass
class GGUFFile:
    """The raw contents of a GGUF file.

    Attributes:
        tensors: GGUF tensor names -> arrays; quantized ones as mlx triples
            (`.weight` uint32 packed, `.scales`, `.biases`), the rest float.
        metadata: key -> plain Python value (str, int, float, bool or list).
        reader: "mlx" (native) or "gguf" (the `gguf` package, dequantized).
        tensor_types: GGUF tensor name -> ggml type name ("Q4_1", "Q4_K", "F32", ...).
        cached: the dequantized tensors came from the float32 cache.
    """

    tensors: dict[str, mx.array]
    metadata: dict[str, Any]
    reader: str
    tensor_types: dict[str, str] = field(default_factory=dict)
    cached: bool = False

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "?"))

    def arch_key(self, key: str, default: Any = None) -> Any:
        """`{architecture}.{key}` from the metadata."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def check_magic(path: Path) -> None:
    """Raise ModelError unless `path` is a readable file that starts with the GGUF magic."""
    if not path.is_file():
        raise ModelError(f"model file not found: {path}")
    with open(path, "rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ModelError(f"{path} is not a GGUF file (bad magic)")


def read_gguf(path: str | Path, cache_dir: Path | None = None) -> GGUFFile:
    """Read every tensor and metadata entry of a GGUF file.

    Args:
        path: the `.gguf` file.
        cache_dir: where to keep the float32 tensors of a file `mx.load` cannot read,
            so the slow numpy dequantization runs once per file (None: no cache).

    Raises:
        ModelError: the file is missing, not GGUF, or holds a tensor type nobody reads.
    """
    path = Path(path)
    check_magic(path)
    try:
        metadata, infos, data_start = read_header(path)
    except (struct.error, UnicodeDecodeError, ValueError) as e:
        raise ModelError(f"cannot read GGUF file {path}: {e}") from e
    if all(type_id in MLX_NATIVE for _, _, type_id, _ in infos):
        try:
            tensors = mx.load(str(path))
        except (RuntimeError, ValueError) as e:  # e.g. a truncated file
            raise ModelError(f"cannot read GGUF file {path}: {e}") from e
        return GGUFFile(tensors=tensors, metadata=metadata, reader="mlx")
    return _read_with_gguf_package(path, metadata, infos, data_start, cache_dir)


def _read_with_gguf_package(
    path: Path,
    metadata: dict[str, Any],
    infos: list[tuple[str, tuple[int, ...], int, int]],
    data_start: int,
    cache_dir: Path | None,
) -> GGUFFile:
    cached = _cache_file(path, cache_dir) if cache_dir is not None else None
    if cached is not None and cached.is_file():
        tensors, extra = mx.load(str(cached), return_metadata=True)
        types = json.loads(extra["tensor_types"])
        return GGUFFile(tensors, metadata, reader="gguf", tensor_types=types, cached=True)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    tensors: dict[str, mx.array] = {}
    types: dict[str, str] = {}
    for name, shape, type_id, offset in infos:
        tensors[name], types[name] = dequantize_tensor(
            raw, data_start + offset, shape, type_id, name
        )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.stem}.{os.getpid()}.safetensors")
        mx.save_safetensors(str(tmp), tensors, metadata={"tensor_types": json.dumps(types)})
        os.replace(tmp, cached)
        for stale in cached.parent.glob(f"{path.stem}-*.safetensors"):
            if stale != cached:  # an older copy of a file since re-pulled or edited
                stale.unlink(missing_ok=True)
    return GGUFFile(tensors, metadata, reader="gguf", tensor_types=types)


def dequantize_tensor(
    raw: np.ndarray, start: int, shape: tuple[int, ...], type_id: int, name: str = "?"
) -> tuple[mx.array, str]:
    """One tensor of a memory-mapped GGUF as float32, and its ggml type name."""
    import gguf

    try:
        qtype = gguf.GGMLQuantizationType(type_id)
        byte_shape = gguf.quants.quant_shape_to_byte_shape(shape, qtype)
        blob = raw[start : start + int(np.prod(byte_shape))].reshape(byte_shape)
        data = gguf.quants.dequantize(blob, qtype)
    except (NotImplementedError, ValueError) as e:
        raise ModelError(f"cannot dequantize GGUF tensor {name} (type {type_id}): {e}") from e
    return mx.array(np.ascontiguousarray(data, dtype=np.float32)), qtype.name


def _cache_file(path: Path, cache_dir: Path) -> Path:
    # Keyed by size and mtime: a re-pulled or edited file gets a fresh entry.
    st = path.stat()
    return cache_dir / f"{path.stem}-{st.st_size}-{st.st_mtime_ns}.safetensors"


# GGUF metadata value types -> struct formats (8 = string, 9 = array).
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_NP = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}


def read_header(
    path: Path,
) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    """Metadata and tensor table of a GGUF (v2/v3) file, without touching tensor data.

    `gguf.GGUFReader` builds a numpy view per array element, which takes ~35 s for a
    151k-token vocabulary; this reads the same header with `struct` in well under a second.

    Returns:
        `(metadata, [(name, numpy_shape, ggml_type, offset)], data_start)`; offsets are
        relative to `data_start`.
    """
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse_header(buf)
    finally:
        buf.close()


def _parse_header(buf: Any) -> tuple[dict[str, Any], list, int]:
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        (v,) = struct.unpack_from(fmt, buf, pos)
        pos += struct.calcsize(fmt)
        return v

    def string() -> str:
        nonlocal pos
        n = take("<Q")
        s = bytes(buf[pos : pos + n]).decode("utf-8")
        pos += n
        return s

    def value(t: int) -> Any:
        nonlocal pos
        if t in _SCALARS:
            return take(_SCALARS[t])
        if t == 8:
            return string()
        if t == 9:
            sub, n = take("<I"), take("<Q")
            if sub in _NP:
                arr = np.frombuffer(buf, dtype=_NP[sub], count=n, offset=pos)
                pos += arr.nbytes
                return arr.tolist()
            return [value(sub) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {t}")

    if bytes(buf[:4]) != GGUF_MAGIC:
        raise ValueError("bad magic")
    pos = 4
    version = take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is not supported")
    n_tensors, n_kv = take("<Q"), take("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = string()
        metadata[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, tuple(reversed(dims)), take("<I"), take("<Q")))
    align = int(metadata.get("general.alignment", 32))
    data_start = (pos + align - 1) // align * align
    return metadata, infos, data_start


def mlx_name(gguf_name: str) -> str | None:
    """The mlx-lm parameter path for a GGUF tensor name, or None if it has no place there."""
    stem, _, suffix = gguf_name.rpartition(".")
    if suffix not in _SUFFIXES:
        return None
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", stem)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{suffix}"
    return None


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation (interleaved RoPE pairs -> half-split pairs).

    llama.cpp writes `w.reshape(H, 2, D/2, ...).swapaxes(1, 2)`; this is its inverse.
    Works on any array whose rows are the output features (weights, scales, biases).
    """
    rows = w.shape[0]
    rest = w.shape[1:]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


def model_args(g: GGUFFile) -> tuple[Any, Any]:
    """`(model_module, ModelArgs)` of the mlx-lm class for this file's architecture."""
    arch = g.architecture
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHS)}"
        )
    if "rope_freqs.weight" in g.tensors:
        raise ModelError(
            "GGUF with per-dimension RoPE frequencies (llama3 rope scaling) is not supported"
        )
    if g.arch_key("rope.scaling.type") not in (None, "none"):
        raise ModelError(f"GGUF RoPE scaling {g.arch_key('rope.scaling.type')!r} is not supported")
    if "token_embd.weight" not in g.tensors:
        raise ModelError("GGUF file has no token_embd.weight tensor")
    vocab = g.tensors["token_embd.weight"].shape[0]

    def need(key: str) -> Any:
        value = g.arch_key(key)
        if value is None:
            raise ModelError(f"GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(need("embedding_length"))
    n_heads = int(need("attention.head_count"))
    common = dict(
        model_type=arch,
        hidden_size=hidden,
        num_hidden_layers=int(need("block_count")),
        intermediate_size=int(need("feed_forward_length")),
        num_attention_heads=n_heads,
        num_key_value_heads=int(g.arch_key("attention.head_count_kv", n_heads)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        vocab_size=int(vocab),
        max_position_embeddings=int(g.arch_key("context_length", 4096)),
        rope_theta=float(g.arch_key("rope.freq_base", 10000.0)),
        tie_word_embeddings="output.weight" not in g.tensors,
    )
    if arch == "llama":
        from mlx_lm.models import llama

        head_dim = int(g.arch_key("attention.key_length", hidden // n_heads))
        return llama, llama.ModelArgs(**common, head_dim=head_dim)
    from mlx_lm.models import qwen2

    return qwen2, qwen2.ModelArgs(**common)


def build_model(g: GGUFFile, dequantize: bool) -> tuple[nn.Module, str]:
    """The mlx-lm model holding this file's weights, and its weight format.

    Args:
        g: the file's contents.
        dequantize: expand quantized triples to float32 (the CPU path); otherwise keep
            them as mlx quantized layers (the GPU path): native for Q4_0/Q4_1/Q8_0 files,
            re-quantized at the source bit width for the rest (see `_requantize`).

    Returns:
        `(model, weight_format)`; the format is "float32", "float16" or e.g. "q4/q8"
        (the bit widths kept, largest share first).
    """
    module, args = model_args(g)
    weights = _mlx_weights(g, args)
    if not dequantize and g.reader == "gguf":
        weights = _requantize(weights, g.tensor_types)
    quantized = {k[: -len(".scales")] for k in weights if k.endswith(".scales")}
    model = module.Model(args)
    bits_of: dict[str, int] = {}
    if quantized and dequantize:
        weights = _dequantize_all(weights, quantized)
    elif quantized:
        for path in quantized:
            bits_of[path] = _bits(weights[f"{path}.weight"], weights[f"{path}.scales"])

        def predicate(path: str, _m: nn.Module) -> bool | dict:
            if path in bits_of:
                return {"group_size": GROUP, "bits": bits_of[path]}
            return False

        nn.quantize(model, class_predicate=predicate)
    if not dequantize:
        # GPU backend: the float tensors (norms, or all of a file the gguf package read) in half.
        weights = {
            k: v if v.dtype == mx.uint32 else v.astype(mx.float16) for k, v in weights.items()
        }
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    if bits_of:
        shares: dict[int, int] = {}
        for path, b in bits_of.items():  # elements per bit width
            shares[b] = shares.get(b, 0) + weights[f"{path}.weight"].size * 32 // b
        fmt = "/".join(f"q{b}" for b in sorted(shares, key=shares.get, reverse=True))
    else:
        fmt = "float32" if dequantize else "float16"
    return model, fmt


def _mlx_weights(g: GGUFFile, args: Any) -> dict[str, mx.array]:
    out: dict[str, mx.array] = {}
    for name, value in g.tensors.items():
        target = mlx_name(name)
        if target is None:
            raise ModelError(
                f"GGUF tensor {name!r} has no place in an mlx-lm {g.architecture} model"
            )
        if g.architecture == "llama" and re.fullmatch(r"blk\.\d+\.attn_[qk]\.\w+", name):
            heads = args.num_attention_heads if ".attn_q." in name else args.num_key_value_heads
            value = unpermute_rows(value, heads)
        if value.dtype not in (mx.uint32,) and not name.endswith((".scales", ".biases")):
            value = value.astype(mx.float32)
        out[target] = value
    return out


# ggml type -> mlx bit width for the GPU path of files the gguf package reads. 5- and 6-bit
# types go up to 8 bits: every mlx backend has fast 4- and 8-bit kernels.
REQUANT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 8, "Q5_1": 8, "Q5_K": 8}
REQUANT_BITS |= {"Q6_K": 8, "Q8_0": 8, "Q8_1": 8, "Q8_K": 8}


def _requantize(weights: dict[str, mx.array], types: dict[str, str]) -> dict[str, mx.array]:
    """Quantize each dequantized ggml-quantized matrix back to mlx's affine format.

    4 bits for 4-bit types, else 8; groups of 32: close, not exact (mlx picks its own scales
    and keeps 0 exact, so a value can move by up to one step of its group), and 2-4x less
    memory than float16.
    """
    out = dict(weights)
    for name, qtype in types.items():
        path = mlx_name(name)
        bits = REQUANT_BITS.get(qtype)
        if bits is None or path is None or not path.endswith(".weight"):
            continue
        w = out[path]
        if w.ndim != 2 or w.shape[-1] % GROUP:
            continue
        stem = path[: -len(".weight")]
        out[path], out[f"{stem}.scales"], out[f"{stem}.biases"] = mx.quantize(
            w, group_size=GROUP, bits=bits
        )
    return out


def _bits(w: mx.array, scales: mx.array) -> int:
    # `w` packs `in * bits / 32` uint32 per row; `scales` has one column per GROUP inputs.
    return w.shape[1] * 32 // (scales.shape[1] * GROUP)


def _dequantize_all(weights: dict[str, mx.array], quantized: set[str]) -> dict[str, mx.array]:
    out = {k: v for k, v in weights.items() if k.rpartition(".")[0] not in quantized}
    for path in quantized:
        w, s, b = (weights[f"{path}.{x}"] for x in ("weight", "scales", "biases"))
        bits = _bits(w, s)
        # float32 scales: value = scale * q + bias in full precision, as llama.cpp computes it.
        out[f"{path}.weight"] = mx.dequantize(
            w, s.astype(mx.float32), b.astype(mx.float32), group_size=GROUP, bits=bits
        )
    return out
