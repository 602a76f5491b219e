"""Held-out agreement of the EAGLE-style feature head (core/engine/adapters/head.py, trained
by core/training/head.py) on a workload, with its learning curve: the first draft token after
a verify step (the head reads the target's state) and the second (it reads its own predicted
state).

    python bench/feature_head.py --data examples/jobs/open-256.jsonl --samples 4 --tokens 100000 \
        --answers /tmp/open-256.answers.json -o bench/results/cpu-feature-head-open-256.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from core.benchmark import load_job
from core.engine.adapters.block import target_size
from core.engine.adapters.head import new_head, size
from core.engine.adapters.store import model_key
from core.models import load_model
from core.training.data import answer, answer_cached, features, features_cached, split
from core.training.head import head_examples, train_head


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=60_000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--feature-weight", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=10_000)
    ap.add_argument("--answers", type=Path, default=None, help="keep the answers here")
    ap.add_argument("-o", "--output", type=Path, default=None)
    args = ap.parse_args()
    target = load_model(args.model)
    items = load_job(target, args.data, None)
    prompts = [it.prompt for it in items]
    cap = {repr(it.prompt): it.max_tokens for it in items}
    train_p, held_p = split(prompts, 0.2, 0)
    t0 = time.perf_counter()

    def make():
        tr = answer(target, train_p, [cap[repr(p)] for p in train_p], samples=args.samples, seed=0)
        return tr + answer(target, held_p, [cap[repr(p)] for p in held_p])

    digest = hashlib.sha256(repr((train_p, held_p)).encode()).hexdigest()[:16]
    key = {
        "model": model_key(target),
        "prompts": digest,
        "samples": args.samples,
        "temperature": 0.7,
        "seed": 0,
    }
    examples, _ = answer_cached(args.answers, key, make)
    n_train = len(train_p) * (1 + args.samples)
    feats_path = (
        None
        if args.answers is None
        else args.answers.with_name(args.answers.name + ".L1.safetensors")
    )
    feats, _ = features_cached(
        feats_path, {**key, "layer": 1}, lambda: features(target, examples, 1)
    )
    tr = head_examples(examples[:n_train], feats[:n_train])
    ho = head_examples(examples[n_train:], feats[n_train:])
    t1 = time.perf_counter()
    print(
        f"{len(train_p)} training prompts ({sum(x.n for x in tr)} positions), "
        f"{len(held_p)} held out ({sum(x.n for x in ho)}); data in {t1 - t0:.0f} s",
        flush=True,
    )
    hd = new_head(target.model)
    seen = [0]

    def stepped(n, loss):
        seen[0] += n
        if seen[0] // 5000 != (seen[0] - n) // 5000:
            print(f"  {seen[0]} positions, loss {loss:.3f}", flush=True)

    r = train_head(
        target.model,
        hd,
        tr,
        ho,
        tokens=args.tokens,
        lr=args.lr,
        feature_weight=args.feature_weight,
        eval_every=args.eval_every,
        on_step=stepped,
    )
    r.update(
        model=args.model,
        params=size(hd),
        params_share=size(hd) / target_size(target.model),
        train_prompts=len(train_p),
        held_out_prompts=len(held_p),
        train_positions=sum(x.n for x in tr),
        held_out_positions=sum(x.n for x in ho),
        samples=args.samples,
        lr=args.lr,
        feature_weight=args.feature_weight,
        train_s=round(time.perf_counter() - t1, 1),
    )
    for n, a1, a2 in r["curve"]:
        print(f"  {n:>7} positions: first token {a1:.3f}, second {a2:.3f}")
    print(json.dumps({k: v for k, v in r.items() if k != "curve"}))
    if args.output:
        args.output.write_text(json.dumps(r, indent=1))


if __name__ == "__main__":
    main()
