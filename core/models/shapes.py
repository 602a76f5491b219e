"""Random-weight models at the shapes of named architectures, quantized as shipped.

`random:NAME[-4bit|-8bit]` (for example `random:llama-3-8b-4bit`) builds the mlx-lm model
of NAME's published configuration with random weights, quantized to mlx's affine format
with group size 64 as mlx-community ships such checkpoints, or float16 without a suffix.
Nothing is downloaded and the weights never exist in full precision at once: each layer is
made and quantized in turn.

Random weights decode nonsense, so only what does not depend on the text is meaningful on
them: plain decoding's throughput and the ceiling of drafting with drafts that are always
right (`bench/oracle.py`). Its tokenizer is the byte tokenizer of the tiny models; prompts
are token ids.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama, qwen2

from .model import LoadedModel, ModelError

# The published configurations (config.json) of the architectures a farm runs.
ARCHITECTURES: dict[str, dict] = {
    "llama-3-8b": dict(
        model_type="llama",
        hidden_size=4096,
        num_hidden_layers=32,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-5,
        vocab_size=128256,
        rope_theta=500000.0,
        max_position_embeddings=8192,
        tie_word_embeddings=False,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        num_hidden_layers=28,
        intermediate_size=18944,
        num_attention_heads=28,
        num_key_value_heads=4,
        rms_norm_eps=1e-6,
        vocab_size=152064,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=False,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        num_hidden_layers=28,
        intermediate_size=8960,
        num_attention_heads=12,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
    ),
}
MODULES = {"llama": llama, "qwen2": qwen2}
GROUP_SIZE = 64


def parse(spec: str) -> tuple[str, int | None]:
    """`random:NAME[-4bit|-8bit]` -> (NAME, bits or None for float16)."""
    name = spec.split(":", 1)[1] if ":" in spec else spec
    bits = None
    for b in (4, 8):
        if name.endswith(f"-{b}bit"):
            name, bits = name[: -len(f"-{b}bit")], b
    if name not in ARCHITECTURES:
        raise ModelError(
            f"no architecture {name!r} to build at random; known: {', '.join(ARCHITECTURES)}"
        )
    return name, bits


def random_model(spec: str, seed: int = 0) -> nn.Module:
    """The mlx-lm model of `spec` (see `parse`) with random float16 weights, quantized
    layer by layer when bits are given."""
    name, bits = parse(spec)
    cfg = ARCHITECTURES[name]
    module = MODULES[cfg["model_type"]]
    args = module.ModelArgs(**cfg)
    mx.random.seed(seed)
    model = module.Model(args)
    parts = [model.model.embed_tokens, model.model.norm, *model.model.layers]
    if not args.tie_word_embeddings:
        parts.append(model.lm_head)
    for part in parts:  # made part by part: float32 weights of the whole never exist
        part.set_dtype(mx.float16)
        mx.eval(part.parameters())
    if bits is not None:
        nn.quantize(model, group_size=GROUP_SIZE, bits=bits)
        mx.eval(model.parameters())
    return model


def load_random(spec: str) -> LoadedModel:
    """`random:NAME[-BITSbit]` as a LoadedModel with the byte tokenizer."""
    from .tiny import byte_tokenizer

    name, bits = parse(spec)
    return LoadedModel(
        name=spec,
        model=random_model(spec),
        tokenizer=byte_tokenizer(),
        context_length=ARCHITECTURES[name]["max_position_embeddings"],
        weight_format=f"q{bits}" if bits else "float16",
        info={"architecture": ARCHITECTURES[name]["model_type"], "source": "random"},
    )


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters (what a decode step reads, the embedding aside)."""
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))
