"""Random-weight models at named architectures' shapes: the published shapes, quantized as
mlx-community ships them, built without a download, and served by the engine."""

import mlx.core as mx
import pytest

from core.engine import Engine, GenerationParams
from core.engine.costs import CostSurface
from core.models import ModelError
from core.models.loading import load_model, load_tokenizer
from core.models.shapes import ARCHITECTURES, parse, weight_bytes


def test_names_parse_to_an_architecture_and_bits():
    assert parse("random:llama-3-8b-4bit") == ("llama-3-8b", 4)
    assert parse("random:qwen2.5-7b-8bit") == ("qwen2.5-7b", 8)
    assert parse("random:qwen2.5-1.5b") == ("qwen2.5-1.5b", None)
    with pytest.raises(ModelError, match="known: llama-3-8b"):
        parse("random:gpt-5")


@pytest.mark.slow
def test_a_quantized_random_model_has_the_published_shape():
    """The 1.5B shape in 4 bits: the layers and projections of its config, quantized with
    group size 64, about 4.5 bits a weight; the engine decodes with it."""
    loaded = load_model("random:qwen2.5-1.5b-4bit")
    cfg = ARCHITECTURES["qwen2.5-1.5b"]
    layers = loaded.model.model.layers
    assert len(layers) == cfg["num_hidden_layers"]
    q = layers[0].self_attn.q_proj
    assert (q.bits, q.group_size) == (4, 64)
    assert loaded.model.model.embed_tokens.weight.shape[0] == cfg["vocab_size"]
    assert 0.7e9 < weight_bytes(loaded.model) < 1.3e9  # 1.5B weights at ~4.5 bits
    assert load_tokenizer("random:qwen2.5-1.5b-4bit")[1] == cfg["max_position_embeddings"]


@pytest.mark.gpu
@pytest.mark.skipif(mx.default_device() != mx.gpu, reason="float16 and 4-bit run slowly on the CPU")
def test_the_engine_decodes_with_a_random_model():
    loaded = load_model("random:qwen2.5-1.5b-4bit")
    eng = Engine(loaded, draft="none", surface=CostSurface.flat(), batch_size=2)
    out = eng.generate_many([([1, 2, 3], GenerationParams(max_tokens=3))] * 2)
    assert all(len(r.tokens) == 3 for r in out) and out[0].tokens == out[1].tokens
