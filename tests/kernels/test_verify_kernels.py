"""The GPU kernels agree with the pure-MLX reference exactly (every output, every case)."""

from __future__ import annotations

import mlx.core as mx
import pytest

from kernels import verify_cuda, verify_metal
from kernels.bench_verify import make_case, mismatches
from kernels.verify import verify

DTYPES = [mx.float32, mx.float16, mx.bfloat16]
SHAPES = [(1, "tree"), (6, "tree"), (16, "chain"), (40, "tree")]
VOCABS = [7, 1000, 49152, 151936]
MODES = ["greedy", "sample", "sample_q"]


def _check(backend: str, dtype, n_shape, V: int, mode: str) -> None:
    N, shape = n_shape
    case = make_case(4, N, V, dtype, mode, seed=N * 31 + V % 97, shape=shape)
    ref = verify(**case, backend="ops")
    ker = verify(**case, backend=backend)
    assert mismatches(ref, ker) == dict.fromkeys(mismatches(ref, ref), 0)
    assert int(ker.num_accepted.max()) >= (1 if N > 1 else 0)


@pytest.mark.gpu
@pytest.mark.skipif(not verify_cuda.available(), reason="needs MLX's CUDA backend")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("n_shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_kernel_matches_reference(dtype, n_shape, V, mode):
    _check("cuda", dtype, n_shape, V, mode)


@pytest.mark.gpu
@pytest.mark.skipif(not verify_metal.available(), reason="needs MLX's Metal backend")
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("V", VOCABS)
@pytest.mark.parametrize("n_shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_metal_kernel_matches_reference(dtype, n_shape, V, mode):
    _check("metal", dtype, n_shape, V, mode)


def test_kernels_are_absent_without_their_backend():
    assert verify_cuda.available() == mx.cuda.is_available()
    assert verify_metal.available() == mx.metal.is_available()
