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


SMALL_VOCAB = 6  # small enough to enumerate the exact distribution of two sampled tokens


@pytest.fixture(scope="session")
def small_vocab(tokenizer):
    """Tiny random LoadedModels over a 6-token vocabulary, by seed (distribution tests)."""

    def make(seed: int, name: str = "t") -> LoadedModel:
        model = tiny_model(
            seed,
            vocab_size=SMALL_VOCAB,
            hidden_size=32,
            num_layers=3,
            num_heads=1,
            num_kv_heads=1,
            intermediate_size=32,
            layer_scale=2.0,
        )
        return LoadedModel(name, model, tokenizer, 4096)

    return make


@pytest.fixture
def flat_cost():
    return CostSurface.flat()
