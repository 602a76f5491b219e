"""The held-out lines of a job file: one line per distinct prompt that `applespec calibrate`
(same file, --held-out, --seed) held out and never trained on, to bench a trained adapter
on prompts it has not seen; with `--every`, every such line (a job repeats its prompts), for
a job long enough to keep a batch full.

    python bench/held_out_job.py examples/jobs/open-256.jsonl -o held-out.jsonl
    applespec bench --input held-out.jsonl --draft adapter:6 --reference ours_single \\
        --rows ours_single,ours_single_spec,ours_batched,ours_batched_spec
"""

from __future__ import annotations

import argparse

from core.jobs import iter_job_file, prompt_tokens, tokenizer_target, validate_for
from core.training.data import split


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--held-out", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--every", action="store_true", help="every held-out line, repeats too")
    a = ap.parse_args()
    target = tokenizer_target(a.model)
    with open(a.input, encoding="utf-8") as f:
        raw = f.read().splitlines()  # r.line counts every line, blank ones too
    reqs, bad = validate_for(iter_job_file(a.input), a.model, target)
    if bad:
        raise SystemExit(f"{a.input}: {bad[0].message}")
    prompts = [prompt_tokens(target, r) for r in reqs]
    train, held = split(prompts, a.held_out, a.seed)
    keys = {repr(p) for p in held}
    seen, out = set(), []
    for r, p in zip(reqs, prompts, strict=True):
        if repr(p) in keys and (a.every or repr(p) not in seen):
            seen.add(repr(p))
            out.append(raw[r.line - 1])
    with open(a.output, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")
    print(
        f"{len(out)} held-out lines of {len(held)} distinct prompts ({len(train)} distinct "
        f"prompts trained on) -> {a.output}"
    )


if __name__ == "__main__":
    main()
