"""Models: loading GGUF and mlx-lm models and their tokenizers, the registry of known models,
and tiny random ones for tests. Nothing here depends on the engine.

- `model.py`: `LoadedModel` (weights, tokenizer, name) and `ModelError`;
- `loading.py`: `load_model(spec)` for a registry alias, a GGUF file, an mlx-lm folder,
  `tiny` or `random:ARCH`;
- `registry.py`: the models one can pull, their aliases and install hints;
- `gguf.py`, `gguf_tokenizer.py`: GGUF weights and the tokenizer they embed;
- `tiny.py`, `shapes.py`: random models, tiny or at a published architecture's shapes.
"""

from .loading import load_model
from .model import LoadedModel, ModelError

__all__ = ["LoadedModel", "ModelError", "load_model"]
