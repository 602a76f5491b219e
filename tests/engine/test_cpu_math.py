"""cpu_math's exp, softmax, attention and SwiGLU equal MLX's own to float32 rounding."""

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest

from core.engine import cpu_math


def test_exp_is_within_two_ulps_of_mlx_over_its_range():
    x = mx.concatenate([mx.linspace(-69.0, 69.0, 200001), mx.random.normal((10000,)) * 5])
    ref, got = np.array(mx.exp(x)), np.array(cpu_math.exp(x))
    assert np.max(np.abs(got - ref) / ref) < 2.5e-7
    # beyond the range: clipped to 2^(+-100), never subnormal, never inf
    edge = np.array(cpu_math.exp(mx.array([-1e30, -500.0, 500.0, 1e30])))
    np.testing.assert_allclose(edge, [2.0**-100, 2.0**-100, 2.0**100, 2.0**100], rtol=1e-6)


def test_swiglu_equals_mlx_lm_s():
    gate, x = mx.random.normal((64, 1536)) * 6, mx.random.normal((64, 1536))
    np.testing.assert_allclose(
        np.array(cpu_math.swiglu(gate, x)), np.array(nn.silu(gate) * x), rtol=1e-5, atol=1e-6
    )
    far = np.array(cpu_math.swiglu(mx.array([-300.0, 300.0]), mx.array([1.0, 1.0])))
    assert abs(far[0]) < 1e-27 and far[1] == 300.0


@pytest.mark.parametrize("R,W,S", [(1, 37, 37), (5, 1, 23), (6, 3, 40), (2, 16, 64)])
def test_attention_equals_sdpa_with_the_same_mask(R, W, S):
    rng = np.random.default_rng(R * 100 + W)
    q = mx.array(rng.normal(size=(R, 6, W, 16)).astype(np.float32))
    k = mx.array(rng.normal(size=(R, 2, S, 16)).astype(np.float32)) * 3
    v = mx.array(rng.normal(size=(R, 2, S, 16)).astype(np.float32))
    mask = rng.random((R, 1, W, S)) > 0.4
    mask[..., 0] = True  # every query sees a key
    m = mx.array(mask)
    ref = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=m)
    got = cpu_math.attention(q, k, v, 0.25, cpu_math.keep_mask(m))
    np.testing.assert_allclose(np.array(got), np.array(ref), rtol=1e-5, atol=2e-6)


def test_it_applies_to_float32_on_the_cpu_only():
    assert cpu_math.applies(mx.zeros(3)) == (mx.default_device() == mx.cpu)
    assert not cpu_math.applies(mx.zeros(3, mx.float16))


def test_the_llama_family_mlps_are_recognised_and_others_are_not():
    from mlx_lm.models import llama

    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=8,
        num_hidden_layers=1,
        intermediate_size=16,
        num_attention_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=10,
        num_key_value_heads=2,
    )
    mlp = llama.MLP(args)
    assert cpu_math.is_swiglu_mlp(mlp)
    assert not cpu_math.is_swiglu_mlp(nn.Linear(2, 2))
    x = mx.random.normal((3, 8))
    np.testing.assert_allclose(
        np.array(cpu_math.mlp(mlp, x)), np.array(mlp(x)), rtol=1e-5, atol=1e-6
    )
