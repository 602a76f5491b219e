"""The Qwen2.5-Coder 1.5B/0.5B Q4_K_M pair (pulled with `applespec models pull`)."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from core.models.gguf import dequantize_tensor, mlx_name, read_header
from core.models.gguf_tokenizer import build_tokenizer
from core.models.loading import load_model
from core.models.registry import REGISTRY, model_path

from .test_gguf_tokenizer import TEXTS
from .test_loading_real import greedy

pytestmark = pytest.mark.real_pair

BIG, SMALL = "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"
PATHS = {name: model_path(REGISTRY[name]) for name in (BIG, SMALL)}
missing = [n for n, p in PATHS.items() if p is None]
if missing:
    pytest.skip(
        f"Qwen pair not installed ({', '.join(missing)}): run "
        + " && ".join(f"applespec models pull {n}" for n in missing),
        allow_module_level=True,
    )

QUESTION = "Write a Python function that returns the square of a number."
# Greedy answers recorded from this loader (float32 on CPU) and read for sense.
EXPECTED = {
    SMALL: "Here's a simple Python function to calculate the square of a number:",
    BIG: "```python\ndef square(number):",
}


@pytest.fixture(scope="module")
def headers():
    return {name: read_header(path) for name, path in PATHS.items()}


def test_pair_shares_one_vocabulary(headers):
    big, small = headers[BIG][0], headers[SMALL][0]
    for key in ("tokens", "merges", "token_type", "eos_token_id", "bos_token_id", "pre", "model"):
        assert big[f"tokenizer.ggml.{key}"] == small[f"tokenizer.ggml.{key}"], key
    assert len(big["tokenizer.ggml.tokens"]) == 151936
    assert big["general.architecture"] == small["general.architecture"] == "qwen2"


def test_tokenizer_matches_transformers_qwen2(headers):
    from transformers import Qwen2Tokenizer

    meta = headers[SMALL][0]
    ours = build_tokenizer(meta)
    vocab = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    ref = Qwen2Tokenizer(vocab=vocab, merges=merges)  # HF's own Qwen2 pre-tokenizer and NFC
    for text in TEXTS:
        if "<|" in text:
            continue  # the reference knows no special tokens; see the next test
        ids = ours.encode(text).ids
        assert ids == ref.encode(text, add_special_tokens=False), text
        assert ours.decode(ids, skip_special_tokens=False) == text


def test_specials_stay_whole(headers):
    ours = build_tokenizer(headers[SMALL][0])
    ids = ours.encode("<|im_start|>user\nHi<|im_end|>\n<|fim_prefix|><tool_call>").ids
    assert ids[0] == 151644 and 151645 in ids and ids[-2:] == [151659, 151657]


@pytest.fixture(scope="module")
def small():
    return load_model(SMALL)


@pytest.fixture(scope="module")
def big():
    return load_model(BIG)


@pytest.mark.parametrize("name", [SMALL, BIG])
def test_weights_equal_gguf_dequantization(name, headers, request):
    """Layer 0 and 1 weights (Q4_K, Q6_K, Q5_0, Q8_0, F32 biases) vs gguf.quants.dequantize."""
    lm = request.getfixturevalue("small" if name == SMALL else "big")
    _, infos, data_start = headers[name]
    raw = np.memmap(PATHS[name], dtype=np.uint8, mode="r")
    params = dict(nn.utils.tree_flatten(lm.model.parameters()))
    checked = set()
    seen: set[int] = set()
    for gguf_name, shape, type_id, offset in infos:
        # Layers 0 and 1, the embedding, and the first tensor of every other type.
        if not gguf_name.startswith(("blk.0.", "blk.1.", "token_embd")) and type_id in seen:
            continue
        seen.add(type_id)
        ref, qtype = dequantize_tensor(raw, data_start + offset, shape, type_id, gguf_name)
        got = params[mlx_name(gguf_name)]
        np.testing.assert_array_equal(np.asarray(got), np.asarray(ref), err_msg=gguf_name)
        checked.add(qtype)
    assert {"Q4_K", "Q6_K", "F32"} <= checked


def test_small_greedy_answer(small):
    ids = small.encode_chat([{"role": "user", "content": QUESTION}])
    assert greedy(small, ids, 16).startswith(EXPECTED[SMALL])
    if mx.default_device() == mx.cpu:
        assert small.weight_format == "float32"
    else:  # K-quant files are re-quantized to MLX's affine format on a GPU
        assert small.weight_format.startswith("q")


def test_big_greedy_answer(big):
    ids = big.encode_chat([{"role": "user", "content": QUESTION}])
    assert greedy(big, ids, 10).startswith(EXPECTED[BIG])


def test_big_speculative_greedy_equals_plain(big, small):
    """On the 1.5B target every drafter reproduces plain greedy decoding token for token."""
    from core.engine import CostSurface, Engine, GenerationParams

    prompt = big.encode_chat([{"role": "user", "content": QUESTION}])
    params = GenerationParams(max_tokens=24)
    flat = CostSurface.flat()  # width is free: the drafters draft every step
    want = Engine(big, draft="none", surface=flat, batch_size=1).generate(prompt, params).tokens
    for spec in ("ngram", "early-exit:21", "draft-model:qwen2.5-coder-0.5b", "tree", "auto"):
        eng = Engine(
            big,
            draft=spec,
            k=3 if spec != "tree" else None,
            surface=flat,
            batch_size=1,
            draft_cost=0.3,
            draft_model=small if spec.startswith(("draft", "auto")) else None,
        )
        assert eng.generate(prompt, params).tokens == want, spec
