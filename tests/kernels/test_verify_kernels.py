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


def _ragged_case(V: int, dtype, seed: int):
    """Four rows, each its own tree with a padded tail (kernels.tree.PAD)."""
    import numpy as np

    from kernels.tree import PAD
    from tests.kernels.helpers import random_parents

    rng = np.random.default_rng(seed)
    N = 12
    parents = np.full((4, N), PAD, dtype=np.int32)
    for b, n in enumerate((1, 5, 12, 8)):
        parents[b, :n] = random_parents(n, rng)
    logits = mx.array(rng.normal(size=(4, N, V)).astype(np.float32) * 3).astype(dtype)
    am = np.asarray(mx.argmax(logits.astype(mx.float32), axis=-1))
    tokens = rng.integers(0, V, (4, N)).astype(np.int32)
    for b in range(4):  # make about half the nodes the target's own choice after their parent
        for j in range(1, N):
            if parents[b, j] >= 0 and rng.random() < 0.6:
                tokens[b, j] = am[b, parents[b, j]]
    return logits, mx.array(tokens), parents


@pytest.mark.gpu
@pytest.mark.skipif(not mx.default_device() == mx.gpu, reason="needs a GPU backend")
@pytest.mark.parametrize("V", [7, 49152])
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16])
def test_per_row_trees_and_choices_match_reference(V, dtype):
    from kernels.verify import choose

    backend = "cuda" if verify_cuda.available() else "metal"
    logits, tokens, parents = _ragged_case(V, dtype, seed=V % 101)
    ref = verify(logits, tokens, parents, greedy=True, backend="ops")
    ker = verify(logits, tokens, parents, greedy=True, backend=backend)
    for name in ("path", "num_accepted", "next_token"):
        assert mx.array_equal(getattr(ref, name), getattr(ker, name)).item(), name
    u = mx.random.uniform(shape=(4, 12), key=mx.random.key(3))
    u = (u * 2**24).astype(mx.int32).astype(mx.float32) * 2**-24  # 24-bit: exact seeds
    assert mx.array_equal(
        choose(logits, u, backend="ops"), choose(logits, u, backend=backend)
    ).item()
    assert mx.array_equal(
        choose(logits, None, backend="ops"), choose(logits, None, backend=backend)
    ).item()
