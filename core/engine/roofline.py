"""The physical limits a decode step runs against: weight bytes read and FLOPs per token.

A plain decoding step reads every weight once (the embedding table aside, which it only
gathers from) whatever the batch size, and spends 2 FLOPs per weight per token. So at
`tokens_per_s` with `rows` rows a step, the engine reads `weight_bytes * tokens_per_s /
rows` bytes and computes `2 * weights * tokens_per_s` FLOPs per second; against the
device's memory bandwidth and compute peak these are the shares of the limits reached
(`shares`). The peaks come from the vendors' datasheets for the GPUs named in `PEAKS`;
for another device they are measured here (`measure_peaks`: a large copy and a large
float32 matmul), and said to be measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

# Datasheet peaks: memory bandwidth (bytes/s) and dense 16-bit tensor FLOP/s.
PEAKS = {
    "H100": (3.35e12, 989e12),  # SXM5 80 GB
    "H200": (4.8e12, 989e12),
}


@dataclass
class Peaks:
    bandwidth: float  # bytes/s
    flops: float  # FLOP/s
    source: str  # "datasheet: NAME" or "measured"


def model_weights(model: nn.Module) -> tuple[int, int]:
    """(weights a token multiplies, bytes a decode step reads) of a model: its linear layers
    and output head; a tied embedding counts once, as the head."""
    weights = 0
    nbytes = 0
    for _, m in model.named_modules():
        if isinstance(m, nn.QuantizedLinear):
            out, packed = m.weight.shape
            weights += out * packed * 32 // m.bits
            nbytes += m.weight.nbytes + m.scales.nbytes + (m.biases.nbytes if "biases" in m else 0)
        elif isinstance(m, nn.Linear):
            weights += m.weight.size
            nbytes += m.weight.nbytes
    if getattr(getattr(model, "args", None), "tie_word_embeddings", False):
        emb = model.model.embed_tokens
        if isinstance(emb, nn.QuantizedEmbedding):
            weights += emb.weight.shape[0] * emb.weight.shape[1] * 32 // emb.bits
            nbytes += emb.weight.nbytes + emb.scales.nbytes + emb.biases.nbytes
        else:
            weights += emb.weight.size
            nbytes += emb.weight.nbytes
    return weights, nbytes


def device_peaks() -> Peaks:
    """The default device's peaks: a datasheet's for a named GPU, else measured."""
    if mx.default_device() == mx.gpu:
        try:
            name = str(mx.device_info().get("device_name", ""))
        except (AttributeError, RuntimeError, ValueError):
            name = ""
        for key, (bw, fl) in PEAKS.items():
            if key in name:
                return Peaks(bw, fl, f"datasheet: {key}")
    return measure_peaks()


def measure_peaks(mib: int = 256, n: int = 2048) -> Peaks:
    """This device's bandwidth as a decode step meets it (a float32 matrix of `mib` MiB
    times a vector: every byte read once) and its float32 matmul FLOP/s, each the best of
    three."""
    side = int((mib * 2**20 // 4) ** 0.5)
    a = mx.random.normal((side, side))
    v = mx.random.normal((side, 1))
    x = mx.random.normal((n, n))
    mx.eval(a, v, x)

    def best(f) -> float:
        mx.eval(f())
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            mx.eval(f())
            times.append(time.perf_counter() - t0)
        return min(times)

    bw = a.nbytes / best(lambda: a @ v)
    fl = 2 * n**3 / best(lambda: x @ x)
    return Peaks(bw, fl, "measured")


def shares(tokens_per_s: float, rows: float, model: nn.Module, peaks: Peaks) -> dict:
    """Shares of the bandwidth and compute limits a plain decode at `tokens_per_s` with
    `rows` rows a step reaches."""
    weights, nbytes = model_weights(model)
    bandwidth = nbytes * tokens_per_s / max(rows, 1)
    flops = 2 * weights * tokens_per_s
    return {
        "weight_bytes_per_s": bandwidth,
        "bandwidth_share": bandwidth / peaks.bandwidth,
        "flops_per_s": flops,
        "compute_share": flops / peaks.flops,
    }
