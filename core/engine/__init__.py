"""The speculative engine: a library with no service dependencies (no Celery, no SQL)."""

from .costs import CostSurface, load_or_measure, measure_surface
from .generate import Batch, Engine, GenerationResult, parse_draft_spec
from .sampling import GenerationParams

__all__ = [
    "Batch",
    "CostSurface",
    "Engine",
    "GenerationParams",
    "GenerationResult",
    "load_or_measure",
    "measure_surface",
    "parse_draft_spec",
]
