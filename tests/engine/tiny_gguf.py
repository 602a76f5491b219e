"""Tiny GGUF files written with the `gguf` package, and the weights they must load as.

`write_tiny_gguf` draws a random llama or qwen2, writes it the way llama.cpp's converter
does (Q/K rows permuted for llama only; quantized per row), and returns the float32
weights (mlx-lm names) that a correct loader must produce.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter, quants

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 256, 2, 4, 2, 512
HEAD_DIM = HIDDEN // HEADS
MERGED = ["Ġt", "he"]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# K-quant block layouts: where the float16 super-block scales sit in each block.
_KQUANT_F16 = {T.Q4_K: (144, [0, 2]), T.Q6_K: (210, [208])}


def byte_tokens() -> list[str]:
    """GPT-2's byte alphabet in byte order (the spelling of a byte-level vocabulary)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs, strict=True))]


TOKENS = byte_tokens() + MERGED + SPECIALS
VOCAB = len(TOKENS)


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's LlamaModel.permute (HF rows -> GGUF rows)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def _random_kquant(rng: np.random.Generator, shape: tuple[int, int], qtype: T) -> np.ndarray:
    block, f16_at = _KQUANT_F16[qtype]
    n_blocks = shape[0] * shape[1] // 256
    raw = rng.integers(0, 256, size=(n_blocks, block), dtype=np.uint8)
    for off in f16_at:  # sane super-block scales (random bytes could be inf/nan)
        d = rng.uniform(0.001, 0.01, size=n_blocks).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(shape[0], -1)


def write_tiny_gguf(
    path: Path, arch: str, qtypes: dict[str, T], seed: int = 0, tied: bool = True
) -> dict[str, np.ndarray]:
    """Write a tiny `arch` ("llama" or "qwen2") GGUF; return its expected mlx-lm weights.

    Args:
        path: the file to write.
        arch: "llama" (Q/K permuted, like llama.cpp) or "qwen2" (q/k/v biases, no permute).
        qtypes: GGUF type per tensor stem (`attn_q`, `ffn_down`, `token_embd`...); F32 if absent.
        seed: the random weights.
        tied: no `output.weight` (lm_head tied to the embedding).
    """
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(LAYERS)
    w.add_context_length(2048)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "smollm")
    w.add_token_list(TOKENS)
    w.add_token_types([1] * (VOCAB - len(SPECIALS)) + [3] * len(SPECIALS))
    w.add_token_merges(["Ġ t", "h e"])
    w.add_bos_token_id(TOKENS.index("<|endoftext|>"))
    w.add_eos_token_id(TOKENS.index("<|im_end|>"))
    w.add_chat_template(CHATML)
    w.add_add_bos_token(False)

    expected: dict[str, np.ndarray] = {}

    def tensor(gguf_name: str, mlx_name: str, shape: tuple[int, ...], permute_heads: int = 0):
        stem = gguf_name.rsplit(".", 1)[0].split(".")[-1]
        qtype = qtypes.get(stem, T.F32) if len(shape) == 2 else T.F32
        if qtype in _KQUANT_F16:
            assert not permute_heads, "K-quant test tensors are drawn as bytes: no permute"
            raw = _random_kquant(rng, shape, qtype)
            expected[mlx_name] = quants.dequantize(raw, qtype).astype(np.float32)
            w.add_tensor(gguf_name, raw, raw_dtype=qtype)
            return
        x = (rng.standard_normal(shape) * (0.02 if len(shape) == 2 else 0.1)).astype(np.float32)
        if len(shape) == 1 and gguf_name.endswith("norm.weight"):
            x += 1.0
        stored = llama_cpp_permute(x, permute_heads) if permute_heads else x
        if qtype == T.F32:
            expected[mlx_name] = x
            w.add_tensor(gguf_name, stored)
            return
        raw = quants.quantize(stored, qtype)
        # Rows quantize independently, so the round trip commutes with the row permutation.
        expected[mlx_name] = quants.dequantize(quants.quantize(x, qtype), qtype).astype(np.float32)
        w.add_tensor(gguf_name, raw, raw_dtype=qtype)

    kv = KV_HEADS * HEAD_DIM
    tensor("token_embd.weight", "model.embed_tokens.weight", (VOCAB, HIDDEN))
    for i in range(LAYERS):
        p, m = f"blk.{i}.", f"model.layers.{i}."
        perm = arch == "llama"
        tensor(p + "attn_q.weight", m + "self_attn.q_proj.weight", (HIDDEN, HIDDEN), HEADS * perm)
        tensor(p + "attn_k.weight", m + "self_attn.k_proj.weight", (kv, HIDDEN), KV_HEADS * perm)
        tensor(p + "attn_v.weight", m + "self_attn.v_proj.weight", (kv, HIDDEN))
        tensor(p + "attn_output.weight", m + "self_attn.o_proj.weight", (HIDDEN, HIDDEN))
        if arch == "qwen2":
            tensor(p + "attn_q.bias", m + "self_attn.q_proj.bias", (HIDDEN,))
            tensor(p + "attn_k.bias", m + "self_attn.k_proj.bias", (kv,))
            tensor(p + "attn_v.bias", m + "self_attn.v_proj.bias", (kv,))
        tensor(p + "ffn_gate.weight", m + "mlp.gate_proj.weight", (FFN, HIDDEN))
        tensor(p + "ffn_up.weight", m + "mlp.up_proj.weight", (FFN, HIDDEN))
        tensor(p + "ffn_down.weight", m + "mlp.down_proj.weight", (HIDDEN, FFN))
        tensor(p + "attn_norm.weight", m + "input_layernorm.weight", (HIDDEN,))
        tensor(p + "ffn_norm.weight", m + "post_attention_layernorm.weight", (HIDDEN,))
    tensor("output_norm.weight", "model.norm.weight", (HIDDEN,))
    if not tied:
        tensor("output.weight", "lm_head.weight", (VOCAB, HIDDEN))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def reference_model(arch: str, weights: dict[str, np.ndarray], tied: bool = True):
    """The same weights loaded straight into mlx-lm's model class (HF layout, default RoPE)."""
    import mlx.core as mx
    from mlx_lm.models import llama, qwen2

    common = dict(
        model_type=arch,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        intermediate_size=FFN,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        rms_norm_eps=1e-6,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=tied,
    )
    module = llama if arch == "llama" else qwen2
    model = module.Model(module.ModelArgs(**common))
    model.load_weights([(k, mx.array(v)) for k, v in weights.items()], strict=True)
    return model
