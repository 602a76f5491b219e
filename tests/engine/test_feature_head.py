"""The EAGLE-style feature head on a tiny float32 model: it reads only the target's last
hidden states and its own block, training lowers its KL and raises its held-out agreement
(first and second draft token), seeded, within 5% of the target's parameters."""

import mlx.core as mx

from core.engine.adapters import answer, features, split
from core.engine.adapters.head import evaluate, head_examples, new_head, train_head
from core.engine.scorer import head
from tests.engine.test_adapters import WORKLOAD


def _data(target):
    train_p, held_p = split([target.encode_prompt(t) for t in WORKLOAD], 0.25, seed=0)
    train_ex = answer(target, train_p, 20, samples=1)
    held_ex = answer(target, held_p, 20)
    tr = head_examples(train_ex, features(target, train_ex, 1))
    ho = head_examples(held_ex, features(target, held_ex, 1))
    return tr, ho


def test_head_pairs_are_the_targets_state_its_next_token_and_the_state_after(make_tiny):
    target = make_tiny(0)
    prompt = target.encode_prompt(WORKLOAD[0])
    ex = answer(target, [prompt], 12)
    (x,) = head_examples(ex, features(target, ex, 1))
    assert x.n == len(ex[0].answer)  # every answer position but the last
    # The state at p gives x_{p+1} (greedy): the token the pair carries.
    assert head(target.model, x.h).argmax(-1).tolist() == x.tokens.tolist()
    # The teacher at p + 1 is the state at the next position.
    assert mx.allclose(x.teacher[:-1], x.h[1:]).item()


def test_training_the_head_lowers_the_kl_and_raises_held_out_agreement(make_tiny):
    target = make_tiny(0)
    tr, ho = _data(target)
    hd = new_head(target.model)
    r = train_head(target.model, hd, tr, ho, tokens=6000, batch=8, eval_every=2000, seed=0)
    assert r["kl_after"] < 0.5 * r["kl_before"], r
    assert r["after"] >= r["before"] + 0.15, r
    assert r["after_second"] >= r["before_second"] + 0.1, r
    assert r["curve"][0] == (0, r["before"], r["before_second"])
    assert r["curve"][-1] == (r["tokens"], r["after"], r["after_second"])
    assert evaluate(target.model, hd, ho)[0] == r["after"]
    again = new_head(target.model)
    r2 = train_head(target.model, again, tr, ho, tokens=6000, batch=8, eval_every=2000, seed=0)
    assert r2["curve"] == r["curve"]  # seeded
