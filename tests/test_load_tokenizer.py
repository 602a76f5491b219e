"""`load_tokenizer`: a model's tokenizer and context length without its weights, encoding
exactly as the loaded model does (what `submit` validates with).

Beside test_jobs.py rather than in tests/engine/: it is the engine's one entry point the
service side added, and these tests are the service's guarantee.
"""

import pytest

from core.models.loading import load_gguf, load_model, load_tokenizer
from core.models.model import ModelError
from tests.engine.tiny_gguf import write_tiny_gguf

MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "the théorie 12345 <|im_end|> done"},
]


def _same_encoding(tokenizer, target):
    assert list(tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True)) == (
        target.encode_chat(MESSAGES)
    )
    assert list(tokenizer.encode("the the 42")) == target.encode_prompt("the the 42")
    assert set(tokenizer.eos_token_ids) == target.eos_token_ids


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_gguf_header_gives_the_loaded_models_tokenizer_and_context(tmp_path, arch):
    path = tmp_path / f"{arch}.gguf"
    write_tiny_gguf(path, arch, {})
    tokenizer, context = load_tokenizer(str(path))
    target = load_gguf(path)
    assert context == target.context_length == 2048
    _same_encoding(tokenizer, target)


def test_tiny_random_and_bad_specs():
    tokenizer, context = load_tokenizer("tiny-random:7")
    target = load_model("tiny-random:7")
    assert context == target.context_length
    _same_encoding(tokenizer, target)
    with pytest.raises(ModelError, match="model file not found"):
        load_tokenizer("/no/such/model.gguf")


def test_a_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelError, match="not a GGUF file"):
        load_tokenizer(str(path))
    path.write_bytes(b"GGUF\x03\x00\x00\x00truncated")
    with pytest.raises(ModelError, match="cannot read GGUF file"):
        load_tokenizer(str(path))


@pytest.mark.real_model
def test_the_default_model():
    tokenizer, context = load_tokenizer("smollm2-135m")
    target = load_model("smollm2-135m")
    assert context == target.context_length == 8192
    _same_encoding(tokenizer, target)
