"""Tree verification as Metal kernels (`mx.fast.metal_kernel`), same contract as `verify_ops`.

Versions:
    1. node kernel: one threadgroup per (row, node); simd_max / simd_sum reductions over the
       vocabulary; children tried in order with residual masses in threadgroup memory; the
       residual sample by an exponential race (threadgroup argmin of hashed E_v / R(v)).
    2. walk kernel: one thread per row follows accepted children from the root.
The algorithm and arithmetic order mirror kernels/verify_cuda.py line for line.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx

from .launch import launch
from .tree import VerifyResult

THREADS = 256

HEADER = """
#define VF_NEG_INF (-INFINITY)

// Exp(1) variate from a counter hash of (seed, v); kernels/verify.py `race_keys` is the same.
inline float vf_exp1(uint seed, uint v) {
  uint x = seed ^ (v * 0x9E3779B9u);
  x ^= x >> 16;
  x *= 0x7FEB352Du;
  x ^= x >> 15;
  x *= 0x846CA68Bu;
  x ^= x >> 16;
  float u = float((x >> 8) + 1u) * 5.9604644775390625e-08f;
  return -metal::log(u);
}
// Threadgroup reductions: every thread gets the result. `sh` holds >= 32 entries.
inline float vf_block_sum(float v, threadgroup float* sh, uint tid, uint nthreads) {
  uint lane = tid % 32, w = tid / 32, nw = (nthreads + 31) / 32;
  v = simd_sum(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) sh[w] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (w == 0) {
    v = lane < nw ? sh[lane] : 0.f;
    v = simd_sum(v);
    if (lane == 0) sh[0] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return sh[0];
}
inline float vf_block_max(float v, threadgroup float* sh, uint tid, uint nthreads) {
  uint lane = tid % 32, w = tid / 32, nw = (nthreads + 31) / 32;
  v = simd_max(v);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) sh[w] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (w == 0) {
    v = lane < nw ? sh[lane] : VF_NEG_INF;
    v = simd_max(v);
    if (lane == 0) sh[0] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return sh[0];
}
inline void vf_simd_argmax(thread float& v, thread int& i) {
  for (ushort o = 16; o > 0; o >>= 1) {
    float ov = simd_shuffle_xor(v, o);
    int oi = simd_shuffle_xor(i, o);
    if (ov > v || (ov == v && oi < i)) { v = ov; i = oi; }
  }
}
inline void vf_block_argmax(thread float& v, thread int& i, threadgroup float* shf,
                            threadgroup int* shi, uint tid, uint nthreads) {
  uint lane = tid % 32, w = tid / 32, nw = (nthreads + 31) / 32;
  vf_simd_argmax(v, i);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (lane == 0) { shf[w] = v; shi[w] = i; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (w == 0) {
    v = lane < nw ? shf[lane] : VF_NEG_INF;
    i = lane < nw ? shi[lane] : 2147483647;
    vf_simd_argmax(v, i);
    if (lane == 0) { shf[0] = v; shi[0] = i; }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  v = shf[0];
  i = shi[0];
}
"""

NODE_SOURCE = """
  const int N = logits_shape[1];
  const int V = logits_shape[2];
  const int node = threadgroup_position_in_grid.x;
  const int b = node / N;
  const int c = node % N;
  const uint tid = thread_position_in_threadgroup.x;
  const uint T = threads_per_threadgroup.x;
  const device auto* lrow = logits + (size_t)node * V;

  threadgroup float sh_f[32];
  threadgroup int sh_i[32];
  threadgroup int kid_j[MAXS];
  threadgroup int kid_x[MAXS];
  threadgroup float mass[MAXS];
  threadgroup int n_kids[1];

  if (tid == 0) {
    int n = 0;
    for (int j = c + 1; j < N && n < MAXS; ++j) {
      if (parents[b * N + j] == c) { kid_j[n] = j; kid_x[n] = tokens[b * N + j]; ++n; }
    }
    n_kids[0] = n;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int nk = n_kids[0];

  if (GREEDY) {
    float best = VF_NEG_INF;
    int bi = 2147483647;
    for (int v = tid; v < V; v += T) {
      float x = static_cast<float>(lrow[v]);
      if (x > best || (x == best && v < bi)) { best = x; bi = v; }
    }
    vf_block_argmax(best, bi, sh_f, sh_i, tid, T);
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
  for (int v = tid; v < V; v += T) mxv = metal::max(mxv, static_cast<float>(lrow[v]));
  mxv = vf_block_max(mxv, sh_f, tid, T);
  float m = 0.f;
  for (int v = tid; v < V; v += T) m += metal::exp(static_cast<float>(lrow[v]) - mxv);
  m = vf_block_sum(m, sh_f, tid, T);

  int acc = -1;
  int k = 0;
  for (; k < nk; ++k) {
    const int j = kid_j[k];
    const int x = kid_x[k];
    float rx = metal::exp(static_cast<float>(lrow[x]) - mxv);
    float qx = 1.f;
    if (HAS_Q) {
      for (int i = 0; i < k; ++i) {
        float qi = static_cast<float>(q[((size_t)b * N + kid_j[i]) * V + x]);
        rx = metal::max(rx - mass[i] * qi, 0.f);
      }
      qx = static_cast<float>(q[((size_t)b * N + j) * V + x]);
    } else {
      for (int i = 0; i < k; ++i) if (kid_x[i] == x) rx = 0.f;
    }
    const float u = uniforms[((size_t)b * N + j) * 2];
    if ((u * qx) * m < rx) { acc = k; break; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) mass[k] = m;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (HAS_Q) {
      float s = 0.f;
      for (int v = tid; v < V; v += T) {
        float r = metal::exp(static_cast<float>(lrow[v]) - mxv);
        for (int i = 0; i <= k; ++i) {
          float qi = static_cast<float>(q[((size_t)b * N + kid_j[i]) * V + v]);
          r = metal::max(r - mass[i] * qi, 0.f);
        }
        s += r;
      }
      m = vf_block_sum(s, sh_f, tid, T);
    } else {
      m = m - rx;
    }
  }

  if (acc >= 0) {
    if (tid == 0) { child[node] = kid_j[acc]; choice[node] = kid_x[acc]; }
    return;
  }

  // Exponential race over the residual R_k (k = nk): argmin_v E_v / R_k(v).
  const uint seed = uint(uniforms[(size_t)node * 2 + 1] * 4294967296.0f);
  float best = VF_NEG_INF;  // -key, so the block argmax (lowest index on ties) is the argmin
  int bi = 2147483647;
  for (int v = tid; v < V; v += T) {
    float r = metal::exp(static_cast<float>(lrow[v]) - mxv);
    if (HAS_Q) {
      for (int i = 0; i < k; ++i) {
        float qi = static_cast<float>(q[((size_t)b * N + kid_j[i]) * V + v]);
        r = metal::max(r - mass[i] * qi, 0.f);
      }
    } else {
      for (int i = 0; i < k; ++i) if (kid_x[i] == v) r = 0.f;
    }
    if (r > 0.f) {
      float nkey = -(vf_exp1(seed, uint(v)) / r);
      if (nkey > best || (nkey == best && v < bi)) { best = nkey; bi = v; }
    }
  }
  vf_block_argmax(best, bi, sh_f, sh_i, tid, T);
  if (tid == 0) {
    child[node] = -1;
    choice[node] = bi == 2147483647 ? 0 : bi;
  }
"""

WALK_SOURCE = """
  const int B = child_shape[0];
  const int N = child_shape[1];
  const int b = thread_position_in_grid.x;
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
    """The (node, walk) kernels, or None where MLX has no Metal backend."""
    if not mx.metal.is_available():
        return None
    node = mx.fast.metal_kernel(
        name="tree_verify_node",
        input_names=["logits", "tokens", "parents", "uniforms", "q"],
        output_names=["child", "choice"],
        source=NODE_SOURCE,
        header=HEADER,
    )
    walk = mx.fast.metal_kernel(
        name="tree_verify_walk",
        input_names=["child", "choice"],
        output_names=["path", "accepted", "num_accepted", "next_token"],
        source=WALK_SOURCE,
    )
    return node, walk


def verify_metal(
    logits: mx.array,
    tokens: mx.array,
    parents,
    draft_probs: mx.array | None,
    uniforms: mx.array | None,
    greedy: bool,
) -> VerifyResult:
    """Metal implementation of `kernels.verify.verify_ops` (same arguments and result)."""
    kernels = _make_kernel()
    if kernels is None:
        raise RuntimeError("the Metal verify kernel needs MLX's Metal backend")
    return launch(kernels, logits, tokens, parents, draft_probs, uniforms, greedy, THREADS)
