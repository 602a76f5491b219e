"""The tree forward equals chain forwards path by path; compaction equals a fresh prefill;
greedy tree decoding equals plain greedy; tree sampling follows the target."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import llama, qwen2

from core.engine.forward import forward, make_cache
from core.engine.tree import TokenTree, static_tree
from core.engine.tree_forward import compact, tree_forward
from kernels.verify import verify, verify_ops
from tests.kernels.helpers import chi2_critical


def _llama(seed, sharp=4.0, **rope):
    args = llama.ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=3,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=67,
        **rope,
    )
    mx.random.seed(seed)
    m = llama.Model(args)
    m.model.embed_tokens.weight = m.model.embed_tokens.weight * sharp  # sharper outputs
    mx.eval(m.parameters())
    return m


def _qwen2(seed):
    args = qwen2.ModelArgs(
        model_type="qwen2",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        vocab_size=67,
        rope_theta=1e6,
        tie_word_embeddings=False,
    )
    mx.random.seed(seed)
    m = qwen2.Model(args)
    mx.eval(m.parameters())
    return m


MODELS = {
    "llama": lambda s: _llama(s),
    "llama-traditional": lambda s: _llama(s, rope_traditional=True),
    "llama3-scaled": lambda s: _llama(
        s,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "linear-scaled": lambda s: _llama(s, rope_scaling={"type": "linear", "factor": 2.0}),
    "qwen2": _qwen2,
}


def _random_tree(rng, n, vocab, root) -> TokenTree:
    t = TokenTree.root(root)
    for j in range(1, n):
        t.tokens.append(int(rng.integers(vocab)))
        t.parents.append(int(rng.integers(0, j)))
        t.scores.append(1.0)
    return t


def _prefilled(model, prompt):
    cache = make_cache(model)
    mx.eval(forward(model, mx.array([prompt]), cache))
    return cache


def _chain_logits(model, prompt, path_tokens):
    return forward(model, mx.array([path_tokens]), _prefilled(model, prompt))[0, -1]


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("seed", range(2))
def test_tree_logits_equal_chain_logits(kind, seed):
    model = MODELS[kind](seed)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 67, size=21).tolist()
    tree = _random_tree(rng, 14, 67, root=int(rng.integers(67)))
    cache = _prefilled(model, prompt)
    logits = tree_forward(model, tree, cache)[0]  # (N, V)
    assert cache[0].offset == len(prompt) + tree.size
    for i in range(tree.size):
        want = _chain_logits(model, prompt, tree.path_tokens(i))
        assert mx.allclose(logits[i], want, atol=1e-4, rtol=1e-4).item(), (kind, i)


def test_tree_forward_from_a_middle_layer():
    model = _llama(3)
    rng = np.random.default_rng(3)
    prompt = rng.integers(0, 67, size=9).tolist()
    tree = _random_tree(rng, 8, 67, root=5)
    full = tree_forward(model, tree, _prefilled(model, prompt))
    # Run layer 0 by hand through the tree path, then resume at layer 1.
    from core.engine.tree_forward import tree_block

    cache = _prefilled(model, prompt)
    P = cache[0].offset
    h = model.model.embed_tokens(mx.array([tree.tokens]))
    h = tree_block(model.model.layers[0], h, tree.attention_mask(P), cache[0], tree.positions(P))
    resumed = tree_forward(model, tree, cache, hidden=h, start_layer=1)
    assert mx.allclose(full, resumed, atol=1e-5).item()


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_compaction_equals_fresh_prefill(kind):
    model = MODELS[kind](1)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, 67, size=13).tolist()
    tree = _random_tree(rng, 12, 67, root=7)
    deepest = max(range(tree.size), key=lambda i: (tree.depths()[i], i))
    for target in (deepest, 0, tree.size - 1):
        cache = _prefilled(model, prompt)
        tree_forward(model, tree, cache)
        path = tree.path(target)
        compact(cache, len(prompt), path)
        fresh = _prefilled(model, prompt + tree.path_tokens(target))
        for c, f in zip(cache, fresh, strict=True):
            assert c.offset == f.offset == len(prompt) + len(path)
            n = c.offset
            assert mx.allclose(c.keys[..., :n, :], f.keys[..., :n, :], atol=1e-5).item()
            assert mx.allclose(c.values[..., :n, :], f.values[..., :n, :], atol=1e-5).item()
        # and decoding continues as from the fresh cache
        nxt = mx.array([[3]])
        assert mx.allclose(forward(model, nxt, cache), forward(model, nxt, fresh), atol=1e-4).item()


def _plain_greedy(model, prompt, n):
    cache = _prefilled(model, prompt[:-1])
    out, y = [], prompt[-1]
    for _ in range(n):
        y = int(mx.argmax(forward(model, mx.array([[y]]), cache)[0, -1]).item())
        out.append(y)
    return out


def _tree_greedy(model, prompt, n, reference, rng):
    """Greedy tree decoding; the drafter knows the reference at a random sibling rank,
    so paths are deep, siblings get picked, and some branches are wrong."""
    cache = _prefilled(model, prompt[:-1])
    out, root = [], prompt[-1]
    while len(out) < n:

        def expand(path, out=out, root=root):
            pos = len(out) + len(path) - 1
            # a path that agrees with the reference gets the true next token somewhere
            truth = reference[pos] if pos < len(reference) else 0
            agree = [root] + reference[len(out) : pos] == path
            cands = [int(rng.integers(67)) for _ in range(3)]
            if agree and rng.random() < 0.8:
                cands[int(rng.integers(3))] = truth
            return [(t, 1.0 / (r + 1)) for r, t in enumerate(cands)]

        tree = static_tree(root, expand, [3, 2, 1])
        P = cache[0].offset
        logits = tree_forward(model, tree, cache)
        r = verify(logits, mx.array([tree.tokens]), tree.parents, greedy=True)
        k = int(r.num_accepted.item())
        path = r.path[0, : k + 1].tolist()
        compact(cache, P, path)
        out += [tree.tokens[i] for i in path[1:]] + [int(r.next_token.item())]
        root = out[-1]
    return out[:n]


@pytest.mark.parametrize("seed", range(6))
def test_greedy_tree_decoding_equals_plain_greedy(seed):
    model = MODELS["llama" if seed % 2 else "qwen2"](seed)
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 67, size=10).tolist()
    want = _plain_greedy(model, prompt, 40)
    got = _tree_greedy(model, prompt, 40, want, rng)
    assert got == want


def test_tree_sampling_follows_the_target():
    """Tree logits from one verify forward, many uniforms: the first emitted token follows
    softmax(root logits) and the one after an accepted child follows the chain forward's
    softmax at that child (chi-square, one-sided 1e-4, bins with expected count >= 5)."""
    model = _llama(5, sharp=1.5)
    rng = np.random.default_rng(5)
    prompt = rng.integers(0, 67, size=11).tolist()
    root_logits = _chain_logits(model, prompt, [9])
    top = np.argsort(-np.array(root_logits))[:3].tolist()
    tree = TokenTree.root(9)
    for t in top:
        i = tree.add(0, t)
        tree.add(i, int(rng.integers(67)))
    logits = tree_forward(model, tree, _prefilled(model, prompt))  # (1, N, V)
    rows = 30000
    out = verify_ops(
        mx.broadcast_to(logits, (rows, *logits.shape[1:])),
        mx.broadcast_to(mx.array([tree.tokens]), (rows, tree.size)),
        tree.parents,
        None,
        mx.random.uniform(shape=(rows, tree.size, 2), key=mx.random.key(5)),
        False,
    )
    num = np.array(out.num_accepted)
    path = np.array(out.path)
    nxt = np.array(out.next_token)
    toks = np.array(tree.tokens)
    first = np.where(num >= 1, toks[np.maximum(path[:, 1], 0)], nxt)
    _check(first, np.array(mx.softmax(root_logits)), "first token")
    for child in (1, 3):  # the top-1 and top-2 children of the root
        sel = (num >= 1) & (path[:, 1] == child)
        second = np.where(num[sel] >= 2, toks[np.maximum(path[sel, 2], 0)], nxt[sel])
        want = mx.softmax(_chain_logits(model, prompt, tree.path_tokens(child)))
        _check(second, np.array(want), f"after node {child}")


def _check(samples, probs, what):
    n = len(samples)
    counts = np.bincount(samples, minlength=probs.size).astype(float)
    big = probs * n >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(probs[big] * n, probs[~big].sum() * n)
    keep = exp > 0
    stat = float((((obs - exp) ** 2)[keep] / exp[keep]).sum())
    df = int(keep.sum()) - 1
    assert n > 1000, what
    assert stat < chi2_critical(df), f"{what}: chi2 {stat:.1f} (df {df}, n {n})"
