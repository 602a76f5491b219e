import pytest

from core.engine import CostSurface, LoadedModel
from core.engine.tiny import byte_tokenizer, tiny_model


@pytest.fixture(scope="session")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def make_tiny(tokenizer):
    """Build tiny random LoadedModels by seed (cached per session)."""
    made = {}

    def make(seed: int = 0, **kw) -> LoadedModel:
        key = (seed, tuple(sorted(kw.items())))
        if key not in made:
            made[key] = LoadedModel(f"tiny-{seed}", tiny_model(seed, **kw), tokenizer, 4096)
        return made[key]

    return make


@pytest.fixture
def flat_cost():
    return CostSurface.flat()
