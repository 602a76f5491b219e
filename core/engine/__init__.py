"""The speculative engine: a library with no service dependencies (no Celery, no SQL)."""

from .costs import CostCurve, measure_verify_curve
from .generate import Engine, GenerationResult, parse_draft_spec
from .loading import load_model
from .model import LoadedModel, ModelError
from .sampling import GenerationParams

__all__ = [
    "CostCurve",
    "Engine",
    "GenerationParams",
    "GenerationResult",
    "LoadedModel",
    "ModelError",
    "load_model",
    "measure_verify_curve",
    "parse_draft_spec",
]
