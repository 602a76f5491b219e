"""Every knob and tuning constant of the engine, in one frozen record.

An `Engine` takes one `EngineConfig` (or its fields as keywords); batches read it from the
engine and nothing else changes their behaviour. An experiment passes a config of its own
(`dataclasses.replace(config, pipeline=False)`), never patches a class.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .cache import LANE_FROM
from .draft_length import GATE_COST


@dataclass(frozen=True)
class ModeTuning:
    """How `StepModes` runs its trials (step_modes.py's docstring): steps per kind in a
    trial, steps per block, a lost kind's first block, steps between trials (doubling while
    the same kind wins, up to `retry_max`), the rate ratio that drops a kind from a trial,
    the drafters' evidence that starts one, the change in a draft token's price that does,
    and the weight a kind's earlier measurements keep at each trial."""

    trial: int = 8
    block: int = 4
    probe: int = 1
    retry: int = 64
    retry_max: int = 512
    clear: float = 2.0
    evidence: int = 8
    price_move: float = 0.1
    decay: float = 0.5


@dataclass(frozen=True)
class EngineConfig:
    """The engine's settings (the fields `Engine`'s docstring describes by name) and its
    tuning constants. None means "chosen for this machine" where a field says so; `Engine`
    keeps the config with those choices made (`Engine.config`)."""

    k: int | None = None  # fixed draft length; None: chosen per row and step
    batch_size: int | None = None  # rows per batch; None: from the verify-cost surface
    max_rows: int | None = None  # the most rows a batch of this engine will hold
    max_kv_bytes: int | None = None  # KV budget of a batch; None: memory.kv_budget()
    prefill_tokens: int | None = None  # prompt tokens per step; None: 2048 on a GPU, else 256
    lane_from: int = LANE_FROM  # cached positions past which a row's KV moves to a lane
    profile: bool = False  # evaluate at phase boundaries (exact phase times, extra syncs)
    overlap: bool = True  # finish the previous step's rows while the device runs
    pipeline: bool = True  # plain steps double-buffered
    share_prefixes: bool = True  # a joining row copies a prompt prefix another row holds
    step_modes: bool | None = None  # measure kinds of step against each other
    resident: bool | None = None  # the feature head's loop resident on the device; None: GPU
    runs_ahead: bool | None = None  # the device runs a queued forward; None: on a GPU
    batch_limit: int = 256  # rows at most when the batch size comes from the surface
    min_shared_prefix: int = 8  # shorter common prompt prefixes are computed, not copied
    prompt_head: int = 256  # prompt tokens of every row compared at once for a shared prefix
    loop_choose_every: int = 16  # steps between choices of the resident loop's chain length
    loop_switch: float = 1.03  # the predicted gain that changes the loop's chain length
    loop_probe: int = 64  # plain steps, where no chain paid, before the loop runs again
    loop_probe_max: int = 1024  # (doubling each time it still does not pay)
    gate_cost: float = GATE_COST  # a draft token's price past which drafts are gated
    modes: ModeTuning = field(default_factory=ModeTuning)

    def __post_init__(self):
        if self.k is not None and self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch size must be at least 1, got {self.batch_size}")
