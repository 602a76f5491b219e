"""Side-by-side throughput: mlx-lm and our engine on the same loaded weights and prompts.

Everything runs in one process, configurations interleaved prompt by prompt, so the
ratios compare like with like on whatever machine runs it. Absolute times mean something
only on the machine that produced them.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx
from mlx_lm.generate import stream_generate

from .costs import measure_verify_curve
from .generate import Engine
from .model import LoadedModel
from .sampling import GenerationParams

DEFAULT_PROMPTS = Path(__file__).resolve().parents[2] / "examples" / "bench_prompts.jsonl"


@dataclass
class Row:
    name: str
    tokens: int = 0
    seconds: float = 0.0
    steps: int = 0
    emitted: int = 0  # tokens produced by verify steps (the prefill's first token excluded)
    drafted: int = 0
    accepted: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    by_category: dict[str, list[float]] = field(default_factory=dict)  # tokens, s, steps, emitted

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def load_prompts(path: str | Path | None = None) -> list[dict]:
    """Bench prompts: JSONL lines with `messages` (chat) or `prompt` (raw), and `category`."""
    lines = Path(path or DEFAULT_PROMPTS).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def encode(target: LoadedModel, item: dict) -> list[int]:
    if "messages" in item:
        return target.encode_chat(item["messages"])
    return target.encode_prompt(item["prompt"])


def mlx_lm_runner(
    target: LoadedModel, max_tokens: int, draft: LoadedModel | None = None, num_draft: int = 0
) -> Callable[[list[int]], tuple[list[int], dict]]:
    """mlx-lm's own `stream_generate` (optionally with its speculative decoding)."""

    def run(prompt: list[int]) -> tuple[list[int], dict]:
        kw = {"draft_model": draft.model, "num_draft_tokens": num_draft} if draft else {}
        toks, from_draft, last = [], 0, None
        for r in stream_generate(target.model, target.tokenizer, prompt, max_tokens, **kw):
            toks.append(r.token)
            from_draft += bool(r.from_draft)
            last = r
        if last is not None and last.finish_reason == "stop":
            toks.pop()  # the EOS token
        return toks, {"from_draft": from_draft}

    return run


def engine_runner(engine: Engine, max_tokens: int):
    def run(prompt: list[int]) -> tuple[list[int], dict]:
        r = engine.generate(prompt, GenerationParams(max_tokens=max_tokens))
        return r.tokens, r.speculative

    return run


def run_bench(
    target: LoadedModel,
    prompts: list[dict],
    drafters: Iterable[str],
    max_tokens: int = 128,
    draft_model: LoadedModel | None = None,
    mlx_lm_draft_tokens: Iterable[int] = (),
    progress: Callable[[str], None] = lambda s: None,
) -> dict:
    """Run every configuration on every prompt, interleaved, and return the table as a dict.

    Rows: `mlx_lm`, `mlx_lm_speculative_k{n}` (when a draft model is given), `ours_none`,
    `ours_<drafter>` for each drafter, and `ours_best`/`mlx_lm_speculative` summaries.
    """
    runners: dict[str, Callable] = {"mlx_lm": mlx_lm_runner(target, max_tokens)}
    if draft_model is not None:
        for n in mlx_lm_draft_tokens:
            runners[f"mlx_lm_speculative_k{n}"] = mlx_lm_runner(target, max_tokens, draft_model, n)
    progress("measuring the verify-cost curve")
    cost = measure_verify_curve(target.model)
    for d in ["none", *drafters]:
        # "early-exit:8/4" = early exit at layer 8, fixed k = 4 (paths keep their slashes)
        spec, _, k = d.rpartition("/") if d.rpartition("/")[2].isdigit() else (d, "", "")
        dm = draft_model if spec.startswith("draft-model") or spec == "auto" else None
        eng = Engine(
            target,
            draft="none" if spec == "none-sync" else spec,
            k=int(k) if k else None,
            cost=cost,
            draft_model=dm,
            profile=False,
            double_buffer=spec != "none-sync",  # none-sync: plain decoding, a sync per token
        )
        runners[f"ours_{d}"] = engine_runner(eng, max_tokens)

    encoded = [encode(target, p) for p in prompts]
    # GPU backends compile a kernel per new shape (each draft width, each tree size): a
    # full untimed pass pays that once, as a resident worker does, before the timed pass.
    full = mx.default_device() == mx.gpu
    for name, run in runners.items():
        progress(f"warm-up {name}" + (" (full pass)" if full else ""))
        for prompt in encoded if full else [encoded[0][:32]]:
            _run_short(run, prompt)
    rows = {name: Row(name) for name in runners}
    for i, prompt in enumerate(encoded):
        for name, run in runners.items():
            progress(f"prompt {i + 1}/{len(encoded)}: {name}")
            t0 = time.perf_counter()
            toks, info = run(prompt)
            dt = time.perf_counter() - t0
            row = rows[name]
            row.seconds += dt
            row.tokens += len(toks)
            row.outputs.append(toks)
            row.steps += info.get("verify_steps", 0)
            row.emitted += round(info.get("mean_accepted_length", 0) * info.get("verify_steps", 0))
            row.drafted += info.get("draft_tokens", 0)
            row.accepted += info.get("accepted_tokens", info.get("from_draft", 0))
            cat = row.by_category.setdefault(prompts[i].get("category", "other"), [0, 0, 0, 0])
            cat[0] += len(toks)
            cat[1] += dt
            cat[2] += info.get("verify_steps", 0)
            cat[3] += round(info.get("mean_accepted_length", 0) * info.get("verify_steps", 0))
    return summarize(rows, cost, target, prompts, max_tokens)


def _run_short(run, prompt):
    try:
        run(prompt)
    except Exception:  # noqa: BLE001 - a warm-up failure shows up again in the real run
        pass


def summarize(rows: dict[str, Row], cost, target, prompts, max_tokens) -> dict:
    base = rows["mlx_lm"]
    out = []
    for r in rows.values():
        out.append(
            {
                "name": r.name,
                "tokens_per_s": round(r.tokens_per_s, 3),
                "ratio_vs_mlx_lm": round(r.tokens_per_s / base.tokens_per_s, 3),
                "identical_to_mlx_lm": r.outputs == base.outputs,
                "mean_accepted_length": round(r.emitted / r.steps, 3) if r.steps else None,
                "acceptance_rate": round(r.accepted / r.drafted, 3) if r.drafted else None,
                "tokens": r.tokens,
            }
        )
    for prefix, label in (("ours_", "ours_best"), ("mlx_lm_speculative_k", "mlx_lm_speculative")):
        cands = [o for o in out if o["name"].startswith(prefix)]
        if cands:
            best = max(cands, key=lambda o: o["tokens_per_s"])
            out.append({**best, "name": label, "config": best["name"]})
    categories = {}
    for cat in base.by_category:
        plain = rows["ours_none"].by_category[cat]
        categories[cat] = {
            r.name: {
                "tokens_per_s": round(c[0] / c[1], 3),
                "ratio_vs_ours_none": round((c[0] / c[1]) / (plain[0] / plain[1]), 3),
                "mean_accepted_length": round(c[3] / c[2], 3) if c[2] else None,
            }
            for r in rows.values()
            if r.name.startswith("ours_") and (c := r.by_category[cat])
        }
    return {
        "model": target.name,
        "weight_format": target.weight_format,
        "device": str(mx.default_device()),
        "machine": platform.machine(),
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "verify_cost_ms": dict(zip(cost.widths, [round(m, 3) for m in cost.ms], strict=True)),
        "rows": out,
        "by_category": categories,
    }


def format_table(result: dict) -> str:
    lines = [
        f"model {result['model']} ({result['weight_format']}) on {result['device']}, "
        f"{result['prompts']} prompts x {result['max_tokens']} tokens max",
        "verify cost (ms for w tokens): "
        + ", ".join(f"{w}: {m:.1f}" for w, m in result["verify_cost_ms"].items()),
        f"{'config':<28}{'tok/s':>9}{'vs mlx-lm':>11}{'accepted len':>14}{'accept rate':>13}"
        f"{'identical':>11}",
    ]
    for r in result["rows"]:
        mal = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
        ar = f"{r['acceptance_rate']:.2f}" if r["acceptance_rate"] is not None else "-"
        name = r["name"] + (f" ({r['config']})" if "config" in r else "")
        lines.append(
            f"{name:<28}{r['tokens_per_s']:>9.2f}{r['ratio_vs_mlx_lm']:>10.2f}x{mal:>14}{ar:>13}"
            f"{'yes' if r['identical_to_mlx_lm'] else 'NO':>11}"
        )
    cats = result.get("by_category", {})
    if cats:
        names = [n for n in next(iter(cats.values())) if n != "ours_none"]
        lines.append("")
        lines.append("by category: speedup vs ours_none / mean accepted length")
        widths = [max(18, len(n) - 2) for n in names]
        lines.append(
            f"{'category':<14}"
            + "".join(f"{n[5:]:>{w}}" for n, w in zip(names, widths, strict=True))
        )
        for cat, per in cats.items():
            cells = "".join(
                f"{per[n]['ratio_vs_ours_none']:>{w - 9}.2f}x / {per[n]['mean_accepted_length'] or 0:>4.2f}"
                for n, w in zip(names, widths, strict=True)
            )
            lines.append(f"{cat:<14}{cells}")
    return "\n".join(lines)
