"""Self-drafters trained from the target's own outputs: what drafting with them needs.

- `block.py`: the early-exit adapter (the target's first L layers + a trained block that
  reads the target's own layer-L cache entries + the frozen norm and head: no cache of its
  own, see its docstring for why holes cannot happen);
- `head.py`: the EAGLE-style feature head over the target's last hidden states;
- `store.py`: safetensors files under `APPLESPEC_HOME/adapters/`, validated on load.

The drafters that use them are `drafters/adapter.py` (`--draft adapter:L`, `--draft
adapter`) and `drafters/feature_head.py` (`--draft head`). Training them, offline and
online, is core/training's.
"""

from .block import Adapter, new_adapter
from .store import AdapterError, best, load, model_key, save, stored

__all__ = [
    "Adapter",
    "AdapterError",
    "best",
    "load",
    "model_key",
    "new_adapter",
    "save",
    "stored",
]
