"""Tiny random models for tests and local service runs: no download, built in milliseconds.

`tiny-random` (or `tiny-random:SEED`) is an mlx-lm llama with a byte-level tokenizer
(256 byte tokens + 3 specials) and a ChatML template, so every layer of the product
(engine, CLI, workers) can run end to end without the real model.
"""

from __future__ import annotations

import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.tokenizer_utils import TokenizerWrapper

from .model import LoadedModel

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer(chat_template: str = CHATML) -> TokenizerWrapper:
    """A byte-level tokenizer: ids 0..255 are bytes, then <|endoftext|>, <|im_start|>, <|im_end|>."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    # ByteLevel maps each byte to a printable character; order them by byte value.
    byte_chars = [None] * 256
    for b, ch in _bytes_to_unicode().items():
        byte_chars[b] = ch
    assert set(byte_chars) == set(alphabet)
    vocab = {ch: i for i, ch in enumerate(byte_chars)}
    for i, tok in enumerate(SPECIALS):
        vocab[tok] = 256 + i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
    )
    return TokenizerWrapper(hf, eos_token_ids=[256 + SPECIALS.index("<|im_end|>")])


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2's byte-to-printable map, the one ByteLevel uses.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs], strict=True))


def tiny_model(
    seed: int = 0,
    *,
    vocab_size: int = 259,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 2,  # head_dim 32: MLX's CUDA RoPE fails below 32 (grid limit)
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    tie_word_embeddings: bool = False,
    layer_scale: float = 4.0,
) -> llama.Model:
    """A random mlx-lm llama in float32.

    `layer_scale` multiplies the attention and MLP output projections, so the blocks matter
    against the residual stream and the model's next token depends on its context (a plain
    random init mostly repeats the last token).
    """
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        intermediate_size=intermediate_size,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        rms_norm_eps=1e-5,
        vocab_size=vocab_size,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
    )
    mx.random.seed(seed)
    model = llama.Model(args)
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = layer.self_attn.o_proj.weight * layer_scale
        layer.mlp.down_proj.weight = layer.mlp.down_proj.weight * layer_scale
    mx.eval(model.parameters())
    return model


def load_tiny(spec: str = "tiny-random") -> LoadedModel:
    """`tiny-random[:SEED]` as a LoadedModel with the byte tokenizer."""
    seed = int(spec.split(":", 1)[1]) if ":" in spec else 0
    model = tiny_model(seed)
    return LoadedModel(
        name=spec,
        model=model,
        tokenizer=byte_tokenizer(),
        context_length=4096,
        weight_format="float32",
        info={"architecture": "llama", "source": "random"},
    )
