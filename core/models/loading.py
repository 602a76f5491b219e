"""`load_model(spec)`: aliases, GGUF files, mlx-lm directories and hub ids, one entry point."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import mlx.core as mx

from .model import LoadedModel, ModelError
from .registry import REGISTRY, install_hint, model_dir, model_path


def load_model(spec: str) -> LoadedModel:
    """Load a model by alias (`smollm2-135m`), `.gguf` path, mlx-lm directory or hub id.

    Weights stay quantized on a GPU backend (Metal, CUDA); on the CPU backend they are
    dequantized to float32, where MLX's quantized matmul is slow.

    Raises:
        ModelError: with a message a user can act on (missing file, unsupported
            architecture, hub id without network).
    """
    if spec == "tiny-random" or spec.startswith("tiny-random:"):
        from .tiny import load_tiny

        return load_tiny(spec)
    if spec.startswith("random:"):
        from .shapes import load_random

        return load_random(spec)
    if spec in REGISTRY:
        entry = REGISTRY[spec]
        path = model_path(entry)
        if path is None:
            raise ModelError(f"model {spec!r} is not installed; run: {install_hint(entry)}")
        return load_gguf(path, name=spec)
    if spec.endswith(".gguf"):
        return load_gguf(Path(spec).expanduser(), name=spec)
    return load_mlx_lm(spec)


def load_tokenizer(spec: str) -> tuple[Any, int]:
    """The tokenizer and context length of a model spec, without loading its weights.

    A GGUF (alias or `.gguf` path) is read for its header only (metadata, no tensor data);
    `tiny-random[:SEED]` is built (milliseconds); an mlx-lm directory reads its tokenizer
    files and config.json. A hub id falls back to `load_model` (its files must be fetched).
    The tokenizer encodes exactly as the loaded model's does.

    Raises:
        ModelError: as `load_model` (missing file, not GGUF, unsupported tokenizer).
    """
    if spec == "tiny-random" or spec.startswith("tiny-random:"):
        from .tiny import load_tiny

        tiny = load_tiny(spec)
        return tiny.tokenizer, tiny.context_length
    if spec.startswith("random:"):
        from .shapes import ARCHITECTURES, parse
        from .tiny import byte_tokenizer

        return byte_tokenizer(), ARCHITECTURES[parse(spec)[0]]["max_position_embeddings"]
    if spec in REGISTRY:
        entry = REGISTRY[spec]
        path = model_path(entry)
        if path is None:
            raise ModelError(f"model {spec!r} is not installed; run: {install_hint(entry)}")
    elif spec.endswith(".gguf"):
        path = Path(spec).expanduser()
    else:
        local = Path(spec).expanduser()
        if (local / "config.json").is_file():
            return _mlx_lm_tokenizer(local)
        target = load_model(spec)
        return target.tokenizer, target.context_length
    from .gguf import GGUFFile, check_magic, read_header
    from .gguf_tokenizer import load_gguf_tokenizer

    check_magic(path)
    try:
        metadata, _tensors, _start = read_header(path)
    except (struct.error, UnicodeDecodeError, ValueError, OSError) as e:
        raise ModelError(f"cannot read GGUF file {path}: {e}") from e
    header = GGUFFile(tensors={}, metadata=metadata, reader="header")
    return load_gguf_tokenizer(metadata), int(header.arch_key("context_length", 4096))


def _mlx_lm_tokenizer(path: Path) -> tuple[Any, int]:
    """An mlx-lm directory's tokenizer and context length, as `load_mlx_lm` sets them."""
    from mlx_lm.utils import load_config
    from mlx_lm.utils import load_tokenizer as mlx_load_tokenizer

    try:
        config = load_config(path)
        tokenizer = mlx_load_tokenizer(path, eos_token_ids=config.get("eos_token_id", None))
    except Exception as e:  # missing tokenizer files, bad JSON
        raise ModelError(
            f"cannot read the tokenizer of {str(path)!r}: {type(e).__name__}: {e}"
        ) from e
    return tokenizer, int(config.get("max_position_embeddings") or 4096)


def on_gpu() -> bool:
    """True on a GPU backend (Metal or CUDA), where quantized matmuls are fast."""
    return mx.default_device() == mx.gpu


def load_gguf(
    path: str | Path, name: str | None = None, dequantize: bool | None = None
) -> LoadedModel:
    """A GGUF file (llama or qwen2, any quantization) as a LoadedModel.

    Args:
        path: the `.gguf` file.
        name: the spec to record (defaults to the path).
        dequantize: float32 weights; defaults to True on the CPU backend.
    """
    from .gguf import build_model, read_gguf
    from .gguf_tokenizer import load_gguf_tokenizer

    path = Path(path)
    if dequantize is None:
        dequantize = not on_gpu()
    start = time.perf_counter()
    # Files in the model cache (pulled aliases) keep their dequantized tensors beside them.
    cache = model_dir() / "dequantized" if path.resolve().parent == model_dir().resolve() else None
    g = read_gguf(path, cache_dir=cache)
    model, weight_format = build_model(g, dequantize=dequantize)
    tokenizer = load_gguf_tokenizer(g.metadata)
    types = sorted(set(g.tensor_types.values())) if g.tensor_types else None
    return LoadedModel(
        name=name or str(path),
        model=model,
        tokenizer=tokenizer,
        context_length=int(g.arch_key("context_length", 4096)),
        weight_format=weight_format,
        info={
            "source": "gguf",
            "file": str(path),
            "architecture": g.architecture,
            "reader": g.reader,
            "file_type": g.metadata.get("general.file_type"),
            "tensor_types": types,
            "dequantized_cache": g.cached,
            "load_s": round(time.perf_counter() - start, 3),
        },
    )


def load_mlx_lm(spec: str) -> LoadedModel:
    """An mlx-lm model directory or Hugging Face hub id through `mlx_lm.load`."""
    from mlx_lm import load

    path = Path(spec).expanduser()
    looks_local = spec.startswith((".", "/", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise ModelError(
            f"{spec!r} is neither a model alias, a .gguf file nor an mlx-lm model directory "
            f"(no config.json); aliases: {', '.join(REGISTRY)}"
        )
    start = time.perf_counter()
    try:
        model, tokenizer, config = load(str(path) if looks_local else spec, return_config=True)
    except ModelError:
        raise
    except Exception as e:  # hub errors, missing files, unknown model types
        if not looks_local:
            raise ModelError(
                f"cannot load {spec!r}: not a model alias ({', '.join(REGISTRY)}), not a local "
                f"path, and the Hugging Face hub could not provide it ({type(e).__name__}: {e})"
            ) from e
        raise ModelError(f"cannot load mlx-lm model {spec!r}: {type(e).__name__}: {e}") from e
    qbits = (config.get("quantization") or {}).get("bits")
    return LoadedModel(
        name=spec,
        model=model,
        tokenizer=tokenizer,
        context_length=int(config.get("max_position_embeddings") or 4096),
        weight_format=f"q{qbits}" if qbits else _dtype_name(model),
        info={
            "source": "mlx-lm",
            "architecture": config.get("model_type"),
            "load_s": round(time.perf_counter() - start, 3),
        },
    )


def _dtype_name(model) -> str:
    # The embedding's dtype stands for the model's (mlx-lm keeps one float dtype).
    return str(model.model.embed_tokens.weight.dtype).removeprefix("mlx.core.")
