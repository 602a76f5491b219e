"""GGUF -> mlx-lm: tiny files written with the `gguf` package load as the same model."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader

from core.models.gguf import mlx_name, read_header, unpermute_rows
from core.models.loading import load_gguf

from .tiny_gguf import VOCAB, llama_cpp_permute, reference_model, write_tiny_gguf

PROMPT = mx.array([[1, 2, 3, 100, 200, 256, 257, 5, 42, 7]])
# mx.load reads these natively (quantized triples); the other types go through the gguf package.
LLAMA_TYPES = {
    "attn_q": T.Q4_0,
    "attn_k": T.Q8_0,
    "ffn_up": T.Q4_1,
    "ffn_down": T.F16,
    "token_embd": T.Q8_0,
}
QWEN2_TYPES = {
    "attn_q": T.Q4_K,
    "attn_k": T.Q6_K,
    "ffn_gate": T.BF16,
    "ffn_down": T.Q5_0,
    "output": T.Q6_K,
}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_tiny_gguf(path, "llama", LLAMA_TYPES, seed=1, tied=True)


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf"
    return path, write_tiny_gguf(path, "qwen2", QWEN2_TYPES, seed=2, tied=False)


def test_llama_logits_equal_direct_mlx_lm(tiny_llama):
    path, expected = tiny_llama
    lm = load_gguf(path, dequantize=True)
    assert lm.info["reader"] == "mlx" and lm.info["architecture"] == "llama"
    assert lm.weight_format == "float32"
    ref = reference_model("llama", expected, tied=True)
    np.testing.assert_array_equal(np.asarray(lm.model(PROMPT)), np.asarray(ref(PROMPT)))


def test_qwen2_kquants_logits_equal_direct_mlx_lm(tiny_qwen2):
    path, expected = tiny_qwen2
    lm = load_gguf(path, dequantize=True)
    assert lm.info["reader"] == "gguf" and lm.info["architecture"] == "qwen2"
    assert {"Q4_K", "Q6_K", "BF16", "Q5_0"} <= set(lm.info["tensor_types"])
    assert lm.model.args.tie_word_embeddings is False
    ref = reference_model("qwen2", expected, tied=False)
    np.testing.assert_array_equal(np.asarray(lm.model(PROMPT)), np.asarray(ref(PROMPT)))


def test_loaded_weights_are_the_expected_values(tiny_qwen2):
    path, expected = tiny_qwen2
    params = dict(nn.utils.tree_flatten(load_gguf(path, dequantize=True).model.parameters()))
    assert set(params) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(np.asarray(params[name]), value, err_msg=name)


def test_gpu_path_keeps_quantized_layers(tiny_llama):
    path, _ = tiny_llama
    full = load_gguf(path, dequantize=True)
    quant = load_gguf(path, dequantize=False)
    attn = quant.model.model.layers[0].self_attn
    assert isinstance(attn.q_proj, nn.QuantizedLinear) and attn.q_proj.bits == 4
    assert isinstance(attn.k_proj, nn.QuantizedLinear) and attn.k_proj.bits == 8
    assert isinstance(quant.model.model.embed_tokens, nn.QuantizedEmbedding)
    assert quant.weight_format == "q4/q8"
    a, b = full.model(PROMPT), quant.model(PROMPT).astype(mx.float32)
    # Same quantized values; only the float16 activations differ.
    assert mx.abs(a - b).max().item() < 0.02 * mx.abs(a).max().item()
    assert (mx.argmax(a, -1) == mx.argmax(b, -1)).all().item()


def test_unpermute_inverts_llama_cpp_permute():
    x = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    for heads in (1, 2, 4, 8):
        back = unpermute_rows(mx.array(llama_cpp_permute(x, heads)), heads)
        np.testing.assert_array_equal(np.asarray(back), x)


def test_header_reader_matches_gguf_package(tiny_qwen2):
    path, _ = tiny_qwen2
    metadata, infos, data_start = read_header(path)
    reader = GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}
    assert metadata == fields
    assert [(n, s, t, data_start + o) for n, s, t, o in infos] == [
        (
            t.name,
            tuple(int(d) for d in reversed(t.shape.tolist())),
            int(t.tensor_type),
            t.data_offset,
        )
        for t in reader.tensors
    ]


@pytest.mark.parametrize(
    "gguf_name, expected",
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output.weight", "lm_head.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("blk.12.attn_q.bias", "model.layers.12.self_attn.q_proj.bias"),
        ("blk.0.attn_output.scales", "model.layers.0.self_attn.o_proj.scales"),
        ("blk.3.ffn_down.biases", "model.layers.3.mlp.down_proj.biases"),
        ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
        ("rope_freqs.weight", None),
        ("blk.0.attn_q_norm.weight", None),
    ],
)
def test_tensor_names(gguf_name, expected):
    assert mlx_name(gguf_name) == expected


def test_tokenizer_from_tiny_metadata(tiny_qwen2, tiny_llama):
    for path, _ in (tiny_qwen2, tiny_llama):
        lm = load_gguf(path)
        ids = lm.encode_prompt("the then 12")
        # "Ġt" (id 256) and "he" (id 257) come from the file's merges; digits split.
        assert ids == [ord("t"), 257, 256, 257, ord("n"), ord(" "), ord("1"), ord("2")]
        chat = lm.encode_chat([{"role": "user", "content": "hi"}])
        assert chat[0] == VOCAB - 2  # <|im_start|> whole
        assert lm.decode(chat) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        assert lm.eos_token_ids == {VOCAB - 1, VOCAB - 3}  # <|im_end|>, <|endoftext|>


def test_q4_k_never_goes_through_mx_load(tmp_path):
    """mx.load turns Q4_K into float16 without an error, but with wrong values."""
    path = tmp_path / "q4k.gguf"
    expected = write_tiny_gguf(path, "qwen2", {"attn_q": T.Q4_K, "ffn_up": T.Q6_K}, seed=3)
    got_mx = mx.load(str(path))["blk.0.attn_q.weight"].astype(mx.float32)
    want = expected["model.layers.0.self_attn.q_proj.weight"]
    assert not np.allclose(np.asarray(got_mx), want, atol=1e-2)  # why we route around it
    lm = load_gguf(path)
    assert lm.info["reader"] == "gguf"
    ref = reference_model("qwen2", expected, tied=True)
    np.testing.assert_array_equal(np.asarray(lm.model(PROMPT)), np.asarray(ref(PROMPT)))


def test_dequantized_cache_for_the_model_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_MODEL_DIR", str(tmp_path))
    path = tmp_path / "kq.gguf"
    expected = write_tiny_gguf(path, "qwen2", {"attn_q": T.Q4_K, "ffn_down": T.Q5_0}, seed=4)
    first = load_gguf(path)
    assert first.info["dequantized_cache"] is False
    assert len(list((tmp_path / "dequantized").glob("kq-*.safetensors"))) == 1
    second = load_gguf(path)
    assert second.info["dequantized_cache"] is True
    assert second.info["tensor_types"] == first.info["tensor_types"]
    ref = reference_model("qwen2", expected, tied=True)
    np.testing.assert_array_equal(np.asarray(second.model(PROMPT)), np.asarray(ref(PROMPT)))
    # Rewriting the file replaces its cached copy instead of adding one.
    write_tiny_gguf(path, "qwen2", {"attn_q": T.Q4_K, "ffn_down": T.Q5_0}, seed=5)
    assert load_gguf(path).info["dequantized_cache"] is False
    assert len(list((tmp_path / "dequantized").glob("kq-*.safetensors"))) == 1
    # A file outside the model cache is never cached.
    other = tmp_path / "elsewhere"
    other.mkdir()
    write_tiny_gguf(other / "kq.gguf", "qwen2", {"attn_q": T.Q4_K}, seed=4)
    assert load_gguf(other / "kq.gguf").info["dequantized_cache"] is False
    assert len(list((tmp_path / "dequantized").iterdir())) == 1


def test_gpu_path_requantizes_gguf_package_files(tiny_qwen2):
    path, expected = tiny_qwen2
    lm = load_gguf(path, dequantize=False)
    layer = lm.model.model.layers[1]
    bits = {"q_proj": 4, "k_proj": 8}  # Q4_K, Q6_K
    for name, b in bits.items():
        assert getattr(layer.self_attn, name).bits == b
    assert layer.mlp.down_proj.bits == 8  # Q5_0
    assert not isinstance(layer.mlp.gate_proj, nn.QuantizedLinear)  # BF16 stays float
    assert layer.mlp.gate_proj.weight.dtype == mx.float16
    assert lm.weight_format.startswith("q")
    q = layer.self_attn.q_proj
    back = np.asarray(mx.dequantize(q.weight, q.scales, q.biases, group_size=32, bits=4))
    want = expected["model.layers.1.self_attn.q_proj.weight"]
    groups = want.reshape(-1, 32)
    step = (groups.max(1) - groups.min(1)) / 15  # mlx's step for each group of 32
    err = np.abs(back.reshape(-1, 32) - groups).max(1)
    # mlx keeps 0 exact, so up to one step (not half), plus float16 scales and biases.
    assert (err <= step + 2e-3 * np.abs(groups).max(1)).all()
    assert np.median(err[step > 0] / step[step > 0]) < 0.5
