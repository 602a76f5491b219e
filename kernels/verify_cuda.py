"""Tree verification as CUDA kernels (`mx.fast.cuda_kernel`), same contract as `verify_ops`.

Versions:
    1. node kernel: one block per (row, node); warp-shuffle reductions over the vocabulary
       give max / argmax / softmax mass; the node's children are tried in order (residual
       masses kept in shared memory) and, when none is accepted, the next token is drawn by
       an exponential race (a block argmin of E_v / R(v), hashed E_v; see kernels/verify.py).
       Every node is resolved in parallel, whether or not its parent will be accepted.
    2. walk kernel: one thread per row follows accepted children from the root.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from .launch import launch
from .tree import VerifyResult

THREADS = 256

HEADER = """
#define VF_NEG_INF __int_as_float(0xff800000)
__device__ __forceinline__ float vf_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
}
__device__ __forceinline__ float vf_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
  return v;
}
__device__ __forceinline__ void vf_warp_argmax(float& v, int& i) {
  for (int o = 16; o > 0; o >>= 1) {
    float ov = __shfl_xor_sync(0xffffffff, v, o);
    int oi = __shfl_xor_sync(0xffffffff, i, o);
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
  }
}
// Exp(1) variate from a counter hash of (seed, v); kernels/verify.py `race_keys` is the same.
__device__ __forceinline__ float vf_exp1(unsigned int seed, unsigned int v) {
  unsigned int x = seed ^ (v * 0x9E3779B9u);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  float u = (float)((x >> 8) + 1u) * 5.9604644775390625e-08f;
  return -logf(u);
}
// Block reductions: every thread gets the result. `sh` holds >= 32 floats.
__device__ float vf_block_sum(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = vf_warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? sh[lane] : 0.f;
    v = vf_warp_sum(v);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}
__device__ float vf_block_max(float v, float* sh) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = vf_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? sh[lane] : VF_NEG_INF;
    v = vf_warp_max(v);
    if (lane == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}
__device__ void vf_block_argmax(float& v, int& i, float* shf, int* shi) {
  int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  vf_warp_argmax(v, i);
  __syncthreads();
  if (lane == 0) { shf[w] = v; shi[w] = i; }
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? shf[lane] : VF_NEG_INF;
    i = lane < nw ? shi[lane] : 2147483647;
    vf_warp_argmax(v, i);
    if (lane == 0) { shf[0] = v; shi[0] = i; }
  }
  __syncthreads();
  v = shf[0];
  i = shi[0];
}
"""

# The residual after rejecting siblings 0..k-1 at token v (unnormalised):
#   R_0(v) = exp(l_v - max),  R_{i+1}(v) = max(0, R_i(v) - M_i q_i(v)),  M_i = sum_v R_i(v).
# One-hot drafts (no q): R_k(v) = 0 if v is a rejected sibling's token, else R_0(v).
NODE_SOURCE = """
  const int N = logits_shape[1];
  const int V = logits_shape[2];
  const int node = blockIdx.x;
  const int b = node / N;
  const int c = node % N;
  const int tid = threadIdx.x;
  const int T = blockDim.x;
  const auto* lrow = logits + (size_t)node * V;

  __shared__ float sh_f[32];
  __shared__ int sh_i[32];
  __shared__ int kid_j[MAXS];
  __shared__ int kid_x[MAXS];
  __shared__ float mass[MAXS];
  __shared__ int n_kids;

  if (tid == 0) {
    int n = 0;
    for (int j = c + 1; j < N && n < MAXS; ++j) {
      if (parents[b * N + j] == c) { kid_j[n] = j; kid_x[n] = tokens[b * N + j]; ++n; }
    }
    n_kids = n;
  }
  __syncthreads();
  const int nk = n_kids;

  if (GREEDY) {
    float best = VF_NEG_INF;
    int bi = 2147483647;
    for (int v = tid; v < V; v += T) {
      float x = static_cast<float>(lrow[v]);
      if (x > best || (x == best && v < bi)) { best = x; bi = v; }
    }
    vf_block_argmax(best, bi, sh_f, sh_i);
    if (bi == 2147483647) bi = 0;
    if (tid == 0) {
      int acc = -1;
      for (int k = 0; k < nk; ++k) if (kid_x[k] == bi) { acc = kid_j[k]; break; }
      child[node] = acc;
      choice[node] = bi;
    }
    return;
  }

  float mxv = VF_NEG_INF;
  for (int v = tid; v < V; v += T) mxv = fmaxf(mxv, static_cast<float>(lrow[v]));
  mxv = vf_block_max(mxv, sh_f);
  float m = 0.f;
  for (int v = tid; v < V; v += T) m += expf(static_cast<float>(lrow[v]) - mxv);
  m = vf_block_sum(m, sh_f);

  int acc = -1;
  int k = 0;
  for (; k < nk; ++k) {
    const int j = kid_j[k];
    const int x = kid_x[k];
    float rx = expf(static_cast<float>(lrow[x]) - mxv);
    float qx = 1.f;
    if (HAS_Q) {
      for (int i = 0; i < k; ++i) {
        float qi = static_cast<float>(q[((size_t)b * N + kid_j[i]) * V + x]);
        rx = fmaxf(rx - __fmul_rn(mass[i], qi), 0.f);
      }
      qx = static_cast<float>(q[((size_t)b * N + j) * V + x]);
    } else {
      for (int i = 0; i < k; ++i) if (kid_x[i] == x) rx = 0.f;
    }
    const float u = uniforms[((size_t)b * N + j) * 2];
    if (__fmul_rn(u, qx) * m < rx) { acc = k; break; }
    __syncthreads();
    if (tid == 0) mass[k] = m;
    __syncthreads();
    if (HAS_Q) {
      float s = 0.f;
      for (int v = tid; v < V; v += T) {
        float r = expf(static_cast<float>(lrow[v]) - mxv);
        for (int i = 0; i <= k; ++i) {
          float qi = static_cast<float>(q[((size_t)b * N + kid_j[i]) * V + v]);
          r = fmaxf(r - __fmul_rn(mass[i], qi), 0.f);
        }
        s += r;
      }
      m = vf_block_sum(s, sh_f);
    } else {
      m = m - rx;
    }
  }

  if (acc >= 0) {
    if (tid == 0) { child[node] = kid_j[acc]; choice[node] = kid_x[acc]; }
    return;
  }

  // Exponential race over the residual R_k (k = nk): argmin_v E_v / R_k(v).
  const unsigned int seed = (unsigned int)(uniforms[(size_t)node * 2 + 1] * 4294967296.0f);
  float best = VF_NEG_INF;  // -key, so the block argmax (lowest index on ties) is the argmin
  int bi = 2147483647;
  for (int v = tid; v < V; v += T) {
    float r = expf(static_cast<float>(lrow[v]) - mxv);
    if (HAS_Q) {
      for (int i = 0; i < k; ++i) {
        float qi = static_cast<float>(q[((size_t)b * N + kid_j[i]) * V + v]);
        r = fmaxf(r - __fmul_rn(mass[i], qi), 0.f);
      }
    } else {
      for (int i = 0; i < k; ++i) if (kid_x[i] == v) r = 0.f;
    }
    if (r > 0.f) {
      float nkey = -(vf_exp1(seed, (unsigned int)v) / r);
      if (nkey > best || (nkey == best && v < bi)) { best = nkey; bi = v; }
    }
  }
  vf_block_argmax(best, bi, sh_f, sh_i);
  if (tid == 0) {
    child[node] = -1;
    choice[node] = bi == 2147483647 ? 0 : bi;
  }
"""

WALK_SOURCE = """
  const int B = child_shape[0];
  const int N = child_shape[1];
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  for (int i = 0; i < N; ++i) { path[b * N + i] = -1; accepted[b * N + i] = false; }
  path[b * N] = 0;
  accepted[b * N] = true;
  int cur = 0;
  int n = 0;
  while (n < N - 1) {
    int nx = child[b * N + cur];
    if (nx < 0) break;
    ++n;
    path[b * N + n] = nx;
    accepted[b * N + nx] = true;
    cur = nx;
  }
  num_accepted[b] = n;
  next_token[b] = choice[b * N + cur];
"""


def available() -> bool:
    return _make_kernel() is not None


@cache
def _make_kernel():
    """The (node, walk) kernel builders, or None where MLX has no CUDA backend."""
    if not mx.cuda.is_available():
        return None

    # One source for every variant: GREEDY / HAS_Q are compile-time constants, and the
    # inputs a variant does not read are passed as 1-element placeholders.
    node = mx.fast.cuda_kernel(
        name="tree_verify_node",
        input_names=["logits", "tokens", "parents", "uniforms", "q"],
        output_names=["child", "choice"],
        source=NODE_SOURCE,
        header=HEADER,
    )
    walk = mx.fast.cuda_kernel(
        name="tree_verify_walk",
        input_names=["child", "choice"],
        output_names=["path", "accepted", "num_accepted", "next_token"],
        source=WALK_SOURCE,
    )
    return node, walk


def verify_cuda(
    logits: mx.array,
    tokens: mx.array,
    parents,
    draft_probs: mx.array | None,
    uniforms: mx.array | None,
    greedy: bool,
) -> VerifyResult:
    """CUDA implementation of `kernels.verify.verify_ops` (same arguments and result)."""
    kernels = _make_kernel()
    if kernels is None:
        raise RuntimeError("the CUDA verify kernel needs MLX's CUDA backend")
    return launch(kernels, logits, tokens, parents, draft_probs, uniforms, greedy, THREADS)
