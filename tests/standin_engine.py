"""Test-only stand-in for core.engine.Engine until the engine lands on main.

`install()` adds Engine, GenerationParams and GenerationResult to `core.engine` only when
the real ones are missing; it is a no-op once the engine exists. Plain (non-speculative)
decoding with mlx-lm's generate_step, so the service can be tested end to end.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def install() -> bool:
    import core.engine as engine_pkg

    if hasattr(engine_pkg, "Engine"):
        return False
    from core.engine.loading import load_model
    from core.engine.model import ModelError

    @dataclass
    class GenerationParams:
        max_tokens: int = 256
        temperature: float = 0.0
        top_p: float = 1.0
        top_k: int = 0
        seed: int | None = None

    @dataclass
    class GenerationResult:
        tokens: list[int]
        text: str
        finish_reason: str
        prompt_tokens: int
        speculative: dict = field(default_factory=dict)
        timing: dict = field(default_factory=dict)

    class Engine:
        def __init__(self, target, draft="auto", k=None, draft_model=None):
            self.target, self.draft_spec, self.k = target, draft, k

        @classmethod
        def load(cls, model="smollm2-135m", draft="auto", k=None):
            return cls(load_model(model), draft, k)

        def generate(self, prompt_tokens, params):
            import mlx.core as mx
            from mlx_lm.generate import generate_step
            from mlx_lm.sample_utils import make_sampler

            if params.seed is not None:
                mx.random.seed(params.seed)
            start = time.perf_counter()
            sampler = make_sampler(params.temperature, params.top_p, top_k=params.top_k)
            tokens, reason = [], "length"
            eos = self.target.eos_token_ids
            for tok, _ in generate_step(
                mx.array(prompt_tokens),
                self.target.model,
                max_tokens=params.max_tokens,
                sampler=sampler,
            ):
                tok = int(tok)
                if tok in eos:
                    reason = "stop"
                    break
                tokens.append(tok)
            total = time.perf_counter() - start
            n = len(tokens)
            return GenerationResult(
                tokens,
                self.target.decode(tokens),
                reason,
                len(prompt_tokens),
                speculative={
                    "drafter": "none",
                    "draft_tokens": 0,
                    "accepted_tokens": 0,
                    "verify_steps": n,
                    "acceptance_rate": 0.0,
                    "mean_accepted_length": 1.0,
                    "accepted_per_position": [],
                },
                timing={
                    "ttft_s": 0.0,
                    "decode_tokens_per_s": n / total if total else 0.0,
                    "draft_s": 0.0,
                    "verify_s": total,
                    "accept_s": 0.0,
                    "cache_s": 0.0,
                    "total_s": total,
                    "peak_memory_bytes": 0,
                },
            )

        def chat(self, messages, params):
            return self.generate(self.target.encode_chat(messages), params)

    engine_pkg.Engine = Engine
    engine_pkg.GenerationParams = GenerationParams
    engine_pkg.GenerationResult = GenerationResult
    engine_pkg.ModelError = ModelError
    engine_pkg.load_model = load_model
    return True
