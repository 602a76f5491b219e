"""load_model: every kind of spec, and a clear ModelError for each way it can fail."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from core.models.loading import load_model
from core.models.model import ModelError
from core.models.registry import REGISTRY

from .tiny_gguf import write_tiny_gguf


def test_tiny_random_still_loads():
    lm = load_model("tiny-random:3")
    assert lm.name == "tiny-random:3" and lm.vocab_size == 259


def test_gguf_path(tmp_path):
    path = tmp_path / "m.gguf"
    write_tiny_gguf(path, "llama", {})
    lm = load_model(str(path))
    assert lm.name == str(path)
    assert lm.context_length == 2048
    assert lm.info["file"] == str(path)
    assert lm.num_layers == 2


def test_missing_gguf_file(tmp_path):
    with pytest.raises(ModelError, match="model file not found"):
        load_model(str(tmp_path / "nope.gguf"))


def write_minimal_gguf(path, arch: str) -> None:
    """A one-tensor GGUF with only a block count: enough to reach the loader's checks."""
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelError, match="not a GGUF file"):
        load_model(str(path))


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "falcon.gguf"
    write_minimal_gguf(path, "falcon")
    with pytest.raises(ModelError, match="unsupported GGUF architecture 'falcon'"):
        load_model(str(path))


def test_alias_not_installed_names_the_pull_command(tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_MODEL_DIR", str(tmp_path))
    with pytest.raises(ModelError, match="applespec models pull qwen2.5-coder-0.5b"):
        load_model("qwen2.5-coder-0.5b")


def test_hub_id_offline(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelError, match="Hugging Face hub could not provide it"):
        load_model("someone/not-a-cached-model")


def test_local_dir_without_config(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        load_model(str(tmp_path))


def test_unknown_word_is_not_a_traceback(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelError, match="aliases|not a model alias"):
        load_model("smollm")


def test_mlx_lm_directory(tmp_path):
    from mlx_lm.utils import save_config, save_model

    from core.models.tiny import byte_tokenizer, tiny_model

    model = tiny_model(seed=5)
    save_model(tmp_path, model)
    config = {k: v for k, v in vars(model.args).items() if not k.startswith("_")}
    save_config(config, tmp_path / "config.json")
    byte_tokenizer()._tokenizer.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path))
    assert lm.info["source"] == "mlx-lm" and lm.num_layers == 4
    assert lm.weight_format == "float32"
    x = mx.array([[1, 2, 3, 4]])
    np.testing.assert_array_equal(np.asarray(lm.model(x)), np.asarray(model(x)))
    assert lm.decode(lm.encode_prompt("hello")) == "hello"


def test_registry_aliases():
    assert {"smollm2-135m", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"} <= set(REGISTRY)


@pytest.mark.parametrize("cut", [0.5, 0.999])
@pytest.mark.parametrize("types", [{}, {"attn_q": T.Q4_K}], ids=["mx-load", "gguf-package"])
def test_truncated_gguf(tmp_path, cut, types):
    path = tmp_path / "t.gguf"
    write_tiny_gguf(path, "qwen2", types)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ModelError, match="cannot (read|dequantize) GGUF"):
        load_model(str(path))


def test_missing_metadata_key(tmp_path):
    path = tmp_path / "nometa.gguf"
    write_minimal_gguf(path, "llama")
    with pytest.raises(ModelError, match="GGUF metadata lacks llama.embedding_length"):
        load_model(str(path))


def test_short_pieces_are_coded_as_the_tokenizer_does_and_callers_get_their_own_lists(
    make_tiny,
):
    t = make_tiny(0)
    for text in ['", "label": "', "x" * 300]:  # remembered, and too long to be
        ids = t.encode_text(text)
        assert ids == list(t.tokenizer.encode(text, add_special_tokens=False))
        ids.append(0)  # a caller's list is its own
        assert t.encode_text(text) == ids[:-1]
        assert t.decode(ids[:-1]) == t.tokenizer.decode(ids[:-1])


def test_texts_coded_in_one_batch_are_coded_as_one_by_one(make_tiny):
    """`encode_texts` (the drafters' batch: remembered pieces, repeats, long texts and
    special-token strings among them) gives each text's own tokenization."""
    t = make_tiny(0)
    texts = ['", "label": "', "x" * 300, '", "label": "', "<|im_end|>\nok", "", " a b  c"]
    t.encode_text(texts[0])  # one remembered before
    got = t.encode_texts(texts)
    assert got == [list(t.tokenizer.encode(x, add_special_tokens=False)) for x in texts]
    got[0].append(0)  # every caller's list is its own, repeats too
    assert got[2] != got[0] and t.encode_text(texts[0]) == got[2]
