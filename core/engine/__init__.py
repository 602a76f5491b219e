"""The speculative engine: a library with no service dependencies (no Celery, no SQL)."""

from .batch import Batch
from .config import EngineConfig
from .costs import CostSurface, load_or_measure, measure_surface
from .engine import Engine, parse_draft_spec
from .observer import StepReport
from .results import GenerationResult
from .sampling import GenerationParams

__all__ = [
    "Batch",
    "CostSurface",
    "Engine",
    "EngineConfig",
    "GenerationParams",
    "GenerationResult",
    "load_or_measure",
    "measure_surface",
    "parse_draft_spec",
    "StepReport",
]
