"""Long prompts: time to first token, peak memory and output against mlx-lm, same weights.

Question: does a long document (2k-8k tokens) get its answer as fast as mlx-lm's
`stream_generate` gives it, identically, in bounded memory?

Each document asks the model to summarise real English text (the licence texts Debian
ships in /usr/share/common-licenses, cut to the asked token count). Each (document,
system) pair runs in its own process so peak RSS is that run's alone:

    PYTHONPATH=. python bench/long_prompts.py [--model smollm2-135m] [--tokens 2048,7800]
        [--max-tokens 32] [--systems mlx_lm,ours:auto]

Prints one line per document: tokens, TTFT and peak RSS of each system, their ratios, and
whether the greedy outputs are identical. `--write-job PATH` writes a 64-item job of such
documents among short prompts instead (examples/jobs/long-mixed-64.jsonl:
`--tokens 2048,2048,2048,2048,7800,7800,7800,7800`), for `applespec bench --input`.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

LICENSES = Path("/usr/share/common-licenses")
TEXTS = ("GPL-3", "GFDL-1.3", "LGPL-2.1", "MPL-2.0", "Apache-2.0", "GPL-2")


def document(tokenizer, tokens: int) -> list[dict]:
    """Chat messages asking for a summary of about `tokens` tokens of licence text."""
    text = "\n\n".join((LICENSES / t).read_text(errors="replace") for t in TEXTS)
    ids = tokenizer.encode(text)
    body = tokenizer.decode(ids[: max(tokens - 40, 16)])
    return [{"role": "user", "content": f"Summarise this document in one sentence:\n\n{body}"}]


def write_mixed_job(path: str, model: str, short_job: str, lengths: list[int]) -> None:
    """A job of one summary request per length in `lengths` (each a different slice of the
    licence texts) followed by the short job's lines, to fill 64 rows: what a labeling farm
    meets when a few long documents come among short prompts."""
    from core.models.loading import load_tokenizer

    tokenizer, _ = load_tokenizer(model)
    text = "\n\n".join((LICENSES / t).read_text(errors="replace") for t in TEXTS)
    ids = tokenizer.encode(text)
    lines = []
    for i, n in enumerate(lengths):
        start = (i * 1777) % max(len(ids) - n, 1)
        body = tokenizer.decode(ids[start : start + max(n - 40, 16)])
        msg = f"Summarise this document in one sentence:\n\n{body}"
        lines.append(
            {
                "custom_id": f"doc-{i + 1}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": msg}], "max_tokens": 64},
            }
        )
    short = [json.loads(x) for x in Path(short_job).read_text().splitlines() if x.strip()]
    lines += short[: 64 - len(lines)]
    Path(path).write_text("".join(json.dumps(x) + "\n" for x in lines))


def run_one(system: str, model: str, tokens: int, max_tokens: int) -> dict:
    """Load the model, build the prompt, generate greedily; TTFT, output and peak RSS."""
    import mlx.core as mx

    from core.models.loading import load_model

    target = load_model(model)
    prompt = target.encode_chat(document(target.tokenizer, tokens))
    t0 = time.perf_counter()
    out: list[int] = []
    ttft = None
    if system == "mlx_lm":
        from mlx_lm.generate import generate_step

        for t, _ in generate_step(mx.array(prompt), target.model, max_tokens=max_tokens):
            if ttft is None:
                ttft = time.perf_counter() - t0
            t = int(t)
            if t in target.eos_token_ids:
                break
            out.append(t)
    else:
        from core.engine import Engine
        from core.engine.sampling import GenerationParams

        # As `applespec run` runs a one-item job: the default drafter, one-time setup first.
        engine = Engine(target, draft=system.split(":", 1)[1], max_rows=1)
        engine.prepare()
        r = engine.generate(prompt, GenerationParams(max_tokens=max_tokens))
        out = r.tokens
        ttft = r.timing["ttft_s"]
    wall = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    return {
        "system": system,
        "prompt_tokens": len(prompt),
        "ttft_s": ttft,
        "wall_s": wall,
        "peak_rss_mib": peak,
        "tokens": out,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", default="2048,7800", help="document lengths, comma-separated")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--systems", default="mlx_lm,ours:auto", help="mlx_lm, ours:DRAFTER")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one system here
    ap.add_argument(
        "--write-job",
        metavar="PATH",
        help="write a 64-item job of documents of --tokens lengths among short prompts "
        "(examples/jobs/grounded-64.jsonl) to PATH and stop",
    )
    a = ap.parse_args()
    if a.write_job:
        lengths = [int(x) for x in a.tokens.split(",")]
        write_mixed_job(a.write_job, a.model, "examples/jobs/grounded-64.jsonl", lengths)
        return
    if a.one:
        print(json.dumps(run_one(a.one, a.model, int(a.tokens), a.max_tokens)))
        return
    for n in [int(x) for x in a.tokens.split(",")]:
        res = {}
        for system in a.systems.split(","):
            cmd = [sys.executable, __file__, "--one", system, "--model", a.model]
            cmd += ["--tokens", str(n), "--max-tokens", str(a.max_tokens)]
            p = subprocess.run(cmd, capture_output=True, text=True)
            if p.returncode != 0:
                tail = p.stderr.strip().splitlines()[-1:] or [f"exit {p.returncode}"]
                res[system] = {"error": f"exit {p.returncode}: {tail[0]}"}
            else:
                res[system] = json.loads(p.stdout.strip().splitlines()[-1])
        parts = [f"document {n} tokens:"]
        for s, r in res.items():
            if "error" in r:
                parts.append(f"{s} FAILED ({r['error']})")
            else:
                parts.append(
                    f"{s} {r['prompt_tokens']} prompt tokens, ttft {r['ttft_s']:.2f} s, "
                    f"peak {r['peak_rss_mib']:.0f} MiB"
                )
        ok = [r for r in res.values() if "error" not in r]
        if len(ok) == 2:
            a0, b0 = ok
            parts.append(
                f"ttft {b0['ttft_s'] / a0['ttft_s']:.2f}x, peak {b0['peak_rss_mib'] / a0['peak_rss_mib']:.2f}x "
                f"({b0['system']} / {a0['system']}), identical output: {a0['tokens'] == b0['tokens']}"
            )
        print("; ".join(parts), flush=True)


if __name__ == "__main__":
    main()
