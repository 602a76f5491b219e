"""Self-drafters trained from the target's own outputs (issue 11).

- `block.py`: the early-exit adapter (the target's first L layers + a trained block that
  reads the target's own layer-L cache entries + the frozen norm and head: no cache of its
  own, see its docstring for why holes cannot happen);
- `data.py`: the target's answers to a workload's prompts and their frozen features;
- `training.py`: KL(full || draft) training and held-out agreement;
- `store.py`: safetensors files under `APPLESPEC_HOME/adapters/`, validated on load.
- `head.py`: the EAGLE-style feature head over the target's last hidden states, trained
  and measured offline (not a drafter yet).

The drafter that uses them is `drafters/adapter.py` (`--draft adapter:L`, `--draft adapter`).
"""

from .block import Adapter, new_adapter
from .data import Example, answer, features, split
from .store import AdapterError, best, load, model_key, save, stored
from .training import TrainConfig, TrainResult, evaluate, train

__all__ = [
    "Adapter",
    "AdapterError",
    "Example",
    "TrainConfig",
    "TrainResult",
    "answer",
    "best",
    "evaluate",
    "features",
    "load",
    "model_key",
    "new_adapter",
    "save",
    "split",
    "stored",
    "train",
]
