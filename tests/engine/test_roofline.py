"""The share of the physical limits a decode reaches: weights counted from the model's
linear layers (quantized or not), a step's bytes against the bandwidth, 2 FLOPs a weight a
token against the compute peak."""

import mlx.nn as nn
import pytest

from core.engine.roofline import Peaks, model_weights, shares


def _linear_weights(model) -> int:
    return sum(m.weight.size for _, m in model.named_modules() if isinstance(m, nn.Linear))


def test_weights_and_bytes_of_a_float_and_a_quantized_model(make_tiny):
    model = make_tiny(0).model
    weights, nbytes = model_weights(model)
    assert weights == _linear_weights(model) and nbytes == 4 * weights  # float32
    tied = make_tiny(0, tie_word_embeddings=True).model
    emb = tied.model.embed_tokens.weight.size
    assert model_weights(tied)[0] == _linear_weights(tied) + emb
    q = make_tiny(1).model
    nn.quantize(q, group_size=32, bits=4)
    qw, qb = model_weights(q)
    assert qw == weights  # the same weights, packed
    assert 4 * weights / 8 < qb < 4 * weights / 4  # 4 bits each, plus scales and biases


def test_shares_of_bandwidth_and_compute(make_tiny):
    model = make_tiny(0).model
    weights, nbytes = model_weights(model)
    s = shares(tokens_per_s=640.0, rows=64, model=model, peaks=Peaks(nbytes * 100, 2e9, "test"))
    assert s["weight_bytes_per_s"] == pytest.approx(nbytes * 10)  # 10 steps a second
    assert s["bandwidth_share"] == pytest.approx(0.1)
    assert s["compute_share"] == pytest.approx(2 * weights * 640 / 2e9)
