"""Which weight format decodes faster on a GPU: re-quantized (mlx affine, the loader's GPU
default) or float16. Loads one GGUF both ways and measures, on the same prompt, the verify
cost surface and plain greedy decoding through the engine, plus the weights' memory.

    python bench/weight_formats.py --model qwen2.5-coder-1.5b

On the CPU backend the loader uses float32 instead (MLX's CPU quantized matmul is slow):
this comparison is for GPU backends.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlx.core as mx  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

from core.engine import Engine  # noqa: E402
from core.engine.costs import measure_surface  # noqa: E402
from core.engine.sampling import GenerationParams  # noqa: E402
from core.models.loading import load_gguf  # noqa: E402
from core.models.registry import REGISTRY, model_path  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a Python function that merges two sorted lists."}]


def load(path: str, fmt: str):
    m = load_gguf(path, dequantize=fmt != "quantized")
    if fmt == "float16":
        m.model.set_dtype(mx.float16)
        mx.eval(m.model.parameters())
        m.weight_format = "float16"
    return m


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="alias or .gguf path")
    ap.add_argument("--max-tokens", type=int, default=128)
    args = ap.parse_args()
    path = str(model_path(REGISTRY[args.model]) if args.model in REGISTRY else args.model)
    print(f"{path} on {mx.default_device()}")
    for fmt in ("quantized", "float16"):
        m = load(path, fmt)
        gib = sum(v.nbytes for _, v in tree_flatten(m.model.parameters())) / 2**30
        surface = measure_surface(m.model, batches=(1, 16), widths=(1, 2, 4, 8, 16, 32))
        eng = Engine(m, draft="none", surface=surface, batch_size=1)
        prompt = m.encode_chat(PROMPT)
        params = GenerationParams(max_tokens=args.max_tokens)
        eng.generate(prompt, params)  # warm-up
        t0 = time.perf_counter()
        r = eng.generate(prompt, params)
        dt = time.perf_counter() - t0
        ms = "; ".join(
            f"batch {b}: "
            + ", ".join(f"{w}: {c:.1f}" for w, c in zip(surface.widths, row, strict=True))
            for b, row in zip(surface.batches, surface.ms, strict=True)
        )
        print(
            f"{m.weight_format:>10}: {gib:.2f} GiB weights, plain decode "
            f"{len(r.tokens) / dt:.1f} tok/s ({len(r.tokens)} tokens), verify ms {ms}",
            flush=True,
        )


if __name__ == "__main__":
    main()
