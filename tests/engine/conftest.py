import pytest

from core.engine import CostSurface
from core.models import LoadedModel
from core.models.tiny import byte_tokenizer, tiny_model


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


ADAPTER_PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "1, 2, 3, 1, 2, 3, 1, 2,",
    "Copy: the red car. Again: the red",
    "def add(a, b):\n    return a + b\n\ndef add(",
]


def store_adapter(target: LoadedModel, layer: int, tokens: int = 600, prompts=None):
    """Train an early-exit adapter for `target` at `layer` briefly (seeded) and store it
    under the current APPLESPEC_HOME, unless one is stored already; returns its path."""
    from core.engine.adapters import new_adapter, save, stored
    from core.training.adapter import TrainConfig
    from core.training.adapter import train as train_adapter
    from core.training.data import answer, features

    have = stored(target, layer)
    if have:
        return have[0][1]
    texts = prompts or ADAPTER_PROMPTS  # strings, or token lists
    ids = [target.encode_prompt(t) if isinstance(t, str) else list(t) for t in texts]
    ex = answer(target, ids, 16, samples=1)
    feats = features(target, ex, layer)
    adapter = new_adapter(target.model, layer)
    cfg = TrainConfig(tokens=tokens, eval_every=0, batch_tokens=256)
    r = train_adapter(target.model, adapter, feats, feats, cfg)
    return save(target, adapter, {"agreement": r.after})


@pytest.fixture(scope="session")
def adapter_home(tmp_path_factory):
    """One APPLESPEC_HOME for the session's stored test adapters."""
    return tmp_path_factory.mktemp("adapter-home")


def store_head(target: LoadedModel, tokens: int = 2000, prompts=None, vocab: int | None = None):
    """Train a feature head for `target` briefly (seeded; over a draft vocabulary of the
    `vocab` tokens its answers hold most, if given) and store it under the current
    APPLESPEC_HOME, unless one is stored already; returns its path."""
    from core.engine.adapters import save, stored
    from core.engine.adapters.head import new_head_adapter
    from core.training.data import answer, features, top_tokens
    from core.training.head import head_examples, train_head

    have = stored(target, kind="feature-head")
    if have:
        return have[0][1]
    texts = prompts or ADAPTER_PROMPTS
    ids = [target.encode_prompt(t) if isinstance(t, str) else list(t) for t in texts]
    ex = answer(target, ids, 24, samples=1)
    pairs = head_examples(ex, features(target, ex, 1))
    adapter = new_head_adapter(target.model)
    if vocab:
        adapter.vocab = top_tokens(ex, vocab, target.eos_token_ids)
    r = train_head(
        target.model, adapter.block, pairs, pairs, tokens=tokens, eval_every=0, vocab=adapter.vocab
    )
    return save(target, adapter, {"agreement": r["after"], "second": r["after_second"]})
