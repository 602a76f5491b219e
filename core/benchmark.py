"""Side-by-side throughput on a job file: mlx-lm's batch_generate and our engine, same weights.

Everything runs in one process on the same loaded model, greedy, on the whole job:

- `mlx_lm_batch_B`: mlx-lm's `batch_generate` at each batch size B tried; `mlx_lm_batch`
  repeats the best one;
- `ours_single`: our engine one item at a time, plain decoding (and `ours_single_spec`, the
  same with the drafter);
- `ours_batched_B` / `ours_batched_spec_B`: our continuous batch at B rows, without and with
  speculation; `ours_batched` / `ours_batched_spec` repeat the best;
- `ours_batched_draft-SPEC_B`: the same with another drafter (`also_draft`), side by side.

Speculative rows report the mean accepted length (tokens per verify step) over the items in
the order they finished, in the job's first and later half and as a curve over eighths of
the job: drafters that learn from the job (`suffix`) accept more as the job goes on.

Each row counts the items whose output is identical to the reference (plain single-row
greedy: mlx-lm's `generate_step`, or `ours_single`), and for every item that differs
records the reference's top-1 minus top-2 logit at the first differing token: batched
matmuls round differently from single-row ones, so near-ties may flip; a gap above
`GAP_BUG` is a bug, not rounding.

Absolute times mean something only on the machine that produced them; the ratios compare
like with like.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from core.engine import Engine, GenerationParams
from core.engine.costs import format_surface
from core.engine.observer import PhaseTotals
from core.engine.roofline import device_peaks, shares
from core.models import LoadedModel

GAP_BUG = 0.05
DEFAULT_JOB = Path(__file__).resolve().parents[1] / "examples" / "jobs" / "grounded-64.jsonl"


def format_phases(seconds: Counter, calls: Counter, wall: float) -> list[str]:
    lines = [f"  {'phase':24s} {'calls':>7s} {'seconds':>8s} {'share':>6s} {'ms/call':>8s}"]
    for label, sec in seconds.most_common():
        lines.append(
            f"  {label:24s} {calls[label]:7d} {sec:8.2f} {sec / wall:6.1%} "
            f"{1000 * sec / calls[label]:8.2f}"
        )
    return lines


class JobFileError(ValueError):
    """A bench input that is not a job file (message names the line)."""


@dataclass
class Item:
    prompt: list[int]
    max_tokens: int
    category: str = "other"
    response_format: dict | None = None  # the line's structured output, when it asks one


@dataclass
class Row:
    name: str
    batch_size: int
    seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)
    drafters: Counter = field(default_factory=Counter)  # verify steps by drafter
    steps: int = 0
    emitted: int = 0
    drafted: int = 0
    accepted: int = 0
    forced: int = 0  # tokens the grammar forced (constrained items)
    mask_s: float = 0.0  # seconds spent computing grammar masks
    config: str | None = None
    curve: list[float] = field(default_factory=list)  # per item, finish order: accepted length
    phases: dict | None = None  # with `phases`: {part: [seconds, calls]}, summed over rounds
    rounds: list[float] = field(default_factory=list)  # seconds of each timed round
    round_changed: int = 0  # items whose output in a later round differs from the first's

    @property
    def tokens(self) -> int:
        return sum(len(o) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def load_job(target: LoadedModel, path: str | Path | None, max_tokens: int | None) -> list[Item]:
    """The items of a job file: OpenAI Batch lines (`run`/`submit` input) or bench lines
    (`{"messages" | "prompt", "category"}`); a job line's category is in `body.metadata`. Sampling parameters are ignored: the bench is
    greedy, so every configuration must produce the same tokens. A line's `response_format`
    is kept: its answer is constrained in every configuration (but `ours_batched_free`)."""
    from core.jobs import parse_job, prompt_tokens

    path = Path(path or DEFAULT_JOB)
    try:
        raw = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise JobFileError(f"cannot read {path}: {e}") from None
    lines, categories = [], []
    for n, line in enumerate(raw, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise JobFileError(f"{path}: line {n}: invalid JSON: {e.msg}") from None
        if (
            isinstance(obj, dict)
            and "custom_id" not in obj
            and ("messages" in obj or "prompt" in obj)
        ):
            # a bench line: give it the job format's envelope
            body = {k: obj[k] for k in ("messages", "max_tokens") if k in obj}
            obj = (
                {
                    "custom_id": f"line-{n}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": body,
                }
                if "messages" in obj
                else {"custom_id": f"line-{n}", "prompt": obj["prompt"]}
            )
        category = "other"
        if isinstance(obj, dict):  # a bench line's own field, or a job line's body metadata
            meta = (
                obj.get("body", {}).get("metadata") if isinstance(obj.get("body"), dict) else None
            )
            category = obj.pop("category", None) or (meta or {}).get("category") or "other"
        categories.append(category)
        lines.append(json.dumps(obj))
    requests, errors = parse_job(lines)
    if errors:
        shown = "; ".join(e.message for e in errors[:3])
        more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
        raise JobFileError(f"{path}: {shown}{more}")
    if not requests:
        raise JobFileError(f"{path} has no requests")
    return [
        Item(
            prompt=prompt_tokens(target, r),
            max_tokens=max_tokens or int(r.params.get("max_tokens") or 256),
            category=categories[r.line - 1] if r.line - 1 < len(categories) else "other",
            response_format=r.params.get("response_format"),
        )
        for r in requests
    ]


def mlx_lm_batch(target: LoadedModel, items: list[Item], batch_size: int) -> list[list[int]]:
    """mlx-lm's `batch_generate` as a new user calls it, at `batch_size` rows; items with a
    `response_format` through its BatchGenerator with llguidance's mask as each row's
    logits processor (`grammar_processor`: the peer a user would assemble)."""
    from mlx_lm.generate import batch_generate

    if any(it.response_format for it in items):
        return mlx_lm_batch_constrained(target, items, batch_size)

    r = batch_generate(
        target.model,
        target.tokenizer,
        [it.prompt for it in items],
        max_tokens=[it.max_tokens for it in items],
        completion_batch_size=batch_size,
        prefill_batch_size=min(batch_size, 8),
        return_token_ids=True,
    )
    return [list(t) for t in r.token_ids]


def grammar_processor(target: LoadedModel, response_format: dict) -> Callable:
    """An mlx-lm logits processor masking a row's logits with llguidance's mask (numpy
    bitmask, applied on the device), its matcher advanced by each token fed back. mlx-lm
    calls it with the row's tokens so far (the prompt first); the first call is at the
    first generated token."""
    from core.engine.grammar import apply_masks, compile_format

    row = compile_format(response_format, target.tokenizer, target.vocab_size).row()
    fed: list[int] = []  # the context's length at the first call (the prompt's)

    def process(tokens: mx.array, logits: mx.array) -> mx.array:
        n = tokens.shape[-1]
        if not fed:
            fed.append(n)
        for t in tokens.reshape(-1)[fed[0] : n].tolist()[len(fed) - 1 :]:
            row.emitted(int(t), 0)
            fed.append(n)
        return apply_masks(logits, [0], row.masks([0], [-1]))

    return process


def mlx_lm_batch_constrained(
    target: LoadedModel, items: list[Item], batch_size: int
) -> list[list[int]]:
    """mlx-lm's BatchGenerator, greedy, each constrained row with its `grammar_processor`."""
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(
        target.model,
        stop_tokens=[[t] for t in target.tokenizer.eos_token_ids],
        completion_batch_size=batch_size,
        prefill_batch_size=min(batch_size, 8),
    )
    procs = [
        [grammar_processor(target, it.response_format)] if it.response_format else []
        for it in items
    ]
    uids = gen.insert(
        [it.prompt for it in items], [it.max_tokens for it in items], logits_processors=procs
    )
    out: dict[int, list[int]] = {u: [] for u in uids}
    while responses := gen.next_generated():
        for r in responses:
            if r.finish_reason != "stop":
                out[r.uid].append(r.token)
    gen.close()
    return [out[u] for u in uids]


def mlx_lm_single(target: LoadedModel, item: Item) -> list[int]:
    """mlx-lm's plain greedy `generate_step`, one row (the reference); an item with a
    `response_format`: plain constrained greedy (llguidance's mask, argmax, advance)."""
    from mlx_lm.generate import generate_step

    out = []
    procs = [grammar_processor(target, item.response_format)] if item.response_format else None
    for t, _ in generate_step(
        mx.array(item.prompt), target.model, max_tokens=item.max_tokens, logits_processors=procs
    ):
        t = int(t)
        if t in target.eos_token_ids:
            break
        out.append(t)
    return out


def mlx_lm_speculative(
    target: LoadedModel, draft: LoadedModel, item: Item, num_draft_tokens: int = 2
) -> list[int]:
    """mlx-lm's own speculative decoding (`speculative_generate_step`) with a draft model,
    one row (it runs no batch), greedy."""
    from mlx_lm.generate import speculative_generate_step

    out = []
    for t, _, _ in speculative_generate_step(
        mx.array(item.prompt),
        target.model,
        draft.model,
        num_draft_tokens=num_draft_tokens,
        max_tokens=item.max_tokens,
    ):
        t = int(t)
        if t in target.eos_token_ids:
            break
        out.append(t)
    return out


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two token lists differ (the shorter's length if one is a
    prefix of the other)."""
    return next(
        (j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def top_gap(target: LoadedModel, prompt: list[int], prefix: list[int]) -> float:
    """Top-1 minus top-2 logit of plain single-row decoding after `prompt + prefix`."""
    logits = target.model(mx.array([prompt + prefix]))[0, -1].astype(mx.float32)
    top = mx.sort(logits)[-2:].tolist()
    return float(top[1] - top[0])


def run_bench(
    target: LoadedModel,
    items: list[Item],
    drafter: str = "auto",
    mlx_lm_batches: list[int] = (8, 16, 32, 64),
    our_batches: list[int] | None = None,
    draft_model: LoadedModel | None = None,
    reference: str = "mlx_lm",
    reference_items: int | None = None,
    configs: set[str] | None = None,
    also_draft: list[str] = (),
    progress: Callable[[str], None] = lambda s: None,
    phases: bool = False,
    repeat: int = 1,
) -> dict:
    """Run every configuration on the whole job and return the table as a dict.

    `reference_items` limits the identity check to the first items (the single-row
    reference then runs on those only). `repeat` times every configuration that many
    times, in rounds that run each configuration once in turn, so that a drift of the
    machine's speed meets every configuration alike; a row's time is its median round,
    and each speculative row's ratio to the others of its batch size is given per round."""
    t_start = time.perf_counter()
    _progress = progress

    def progress(msg: str) -> None:
        _progress(f"[{time.perf_counter() - t_start:7.1f} s] {msg}")

    want = configs or {
        "mlx_lm",
        "ours_single",
        "ours_single_spec",
        "ours_batched",
        "ours_batched_spec",
    }
    kw = {"draft_model": draft_model} if draft_model is not None else {}
    timers = PhaseTotals()  # with `phases`: our engines' step parts, per round
    if phases:
        kw["observers"] = [timers]
    # The surface covers the batch sizes this job can use (not the whole grid).
    rows_max = max(our_batches or [len(items)])
    base = Engine(target, draft=drafter, progress=progress, max_rows=rows_max, **kw)
    surface = base.surface  # measured (or loaded) before any timing
    our_batches = list(our_batches or [base.batch_size])
    # GPU backends compile kernels per shape: an untimed pass over the first 2 x batch
    # items (the shapes a full batch meets) first, as a resident worker would have done.
    warm_full = mx.default_device() == mx.gpu
    rows: list[Row] = []

    plan: list[tuple[Row, Callable[..., tuple[list[list[int]], list]]]] = []

    def timed(name: str, bs: int, fn: Callable[..., tuple[list[list[int]], list]]) -> Row:
        """A configuration to time: its first round runs now (after its warm-up), the
        others in `rounds` below, interleaved with the other configurations'."""
        row = Row(name, bs)
        if warm_full:
            progress(f"{name}: warm-up pass")
            fn(items[: 2 * bs])
        _round(row, fn)
        rows.append(row)
        plan.append((row, fn))
        return row

    def _round(row: Row, fn: Callable[..., tuple[list[list[int]], list]]) -> None:
        first = not row.rounds
        progress(
            f"{row.name}: {len(items)} items" + ("" if first else f", round {len(row.rounds) + 1}")
        )
        timers.clear()
        t0 = time.perf_counter()
        outs, results = fn()
        seconds = time.perf_counter() - t0
        row.rounds.append(seconds)
        row.seconds = statistics.median(row.rounds)
        if first:
            row.outputs = outs
        else:
            changed = sum(a != b for a, b in zip(outs, row.outputs, strict=True))
            row.round_changed = max(row.round_changed, changed)
        if phases and timers.calls:
            sec, calls = timers.seconds, timers.calls
            merged = row.phases or {}
            for k, v in sec.items():
                was = merged.get(k, [0.0, 0])
                merged[k] = [was[0] + v, was[1] + calls[k]]
            row.phases = merged
            for line in format_phases(sec, calls, seconds):
                progress(line)
        if first:  # the acceptance figures: the first round's
            for r in results:  # in the order they finished
                s = r.speculative
                if s.get("verify_steps"):
                    row.curve.append(s["mean_accepted_length"])
                row.drafters.update(s.get("steps_by_drafter", {}))
                row.steps += s.get("verify_steps", 0)
                row.emitted += round(s.get("mean_accepted_length", 0) * s.get("verify_steps", 0))
                row.drafted += s.get("draft_tokens", 0)
                row.accepted += s.get("accepted_tokens", 0)
                row.forced += s.get("forced_tokens", 0)
                row.mask_s += r.timing.get("mask_s", 0.0)
        progress(f"{row.name}: {row.tokens / seconds:.1f} tok/s")

    def ours(spec: str, bs: int, free: bool = False, job_items: list[Item] = items):
        engine = Engine(target, draft=spec, surface=surface, batch_size=bs, **kw)
        engine.acceptance = {}  # every configuration starts from the same priors

        def fn(job=job_items):
            engine.acceptance = {}
            finished: list = []
            res = engine.generate_many(
                [
                    (
                        it.prompt,
                        GenerationParams(
                            max_tokens=it.max_tokens,
                            response_format=None if free else it.response_format,
                        ),
                    )
                    for it in job
                ],
                on_result=finished.append,
            )
            return [r.tokens for r in res], finished

        if not warm_full:  # a short warm-up: the first shapes of this configuration
            engine.generate_many([(items[0].prompt[:16], GenerationParams(max_tokens=4))])
        return fn

    ref_outputs = None
    ref_items = items[: reference_items or len(items)]
    if reference == "mlx_lm":
        progress(f"reference: mlx-lm plain greedy, one row at a time, {len(ref_items)} items")
        t0 = time.perf_counter()
        ref_outputs = [mlx_lm_single(target, it) for it in ref_items]
        rows.append(Row("mlx_lm_single", 1, time.perf_counter() - t0, ref_outputs))
    if "mlx_lm" in want:
        mlx_lm_batch(target, items[:2], 2)  # import and first shapes
        for bs in mlx_lm_batches:
            timed(
                f"mlx_lm_batch_{bs}",
                bs,
                lambda job=items, bs=bs: (mlx_lm_batch(target, job, bs), []),
            )
    if "mlx_lm_spec" in want:
        if draft_model is None:
            raise ValueError("the mlx_lm_spec row needs --draft-model")
        mlx_lm_speculative(target, draft_model, Item(items[0].prompt[:16], 4))  # first shapes
        timed(
            "mlx_lm_spec",
            1,
            lambda job=items: ([mlx_lm_speculative(target, draft_model, it) for it in job], []),
        )
    if "ours_single" in want or reference == "ours_single":
        single = ours("none", 1)
        if "ours_single" in want:
            timed("ours_single", 1, single)
        else:  # only the reference: plain single-row greedy on the checked items
            progress(f"reference: ours, plain, one row at a time, {len(ref_items)} items")
            t0 = time.perf_counter()
            outs, _ = single(ref_items)
            rows.append(Row("ours_single", 1, time.perf_counter() - t0, outs))
    if "ours_single_spec" in want:
        timed("ours_single_spec", 1, ours(drafter, 1))
    batched = [("ours_batched", "none"), ("ours_batched_spec", drafter)]
    if "ours_batched_spec" in want:
        batched += [(f"ours_batched_draft-{spec}", spec) for spec in also_draft]
    for label, spec in batched:
        if label in want or label.startswith("ours_batched_draft-"):
            for bs in our_batches:
                timed(f"{label}_{bs}", bs, ours(spec, bs))
    if "ours_batched_free" in want and any(it.response_format for it in items):
        # Plain decoding with every response_format dropped, each item capped at its
        # constrained answer's length (plain's, at this batch size, when it ran): both rows
        # then decode as many tokens after the same prompts, and their ratio is the masks'.
        for bs in our_batches:
            plain = next((r for r in rows if r.name == f"ours_batched_{bs}"), None)
            capped = items
            if plain is not None:
                capped = [
                    dataclasses.replace(it, max_tokens=max(1, min(it.max_tokens, len(out))))
                    for it, out in zip(items, plain.outputs, strict=True)
                ]
            timed(f"ours_batched_free_{bs}", bs, ours("none", bs, True, capped))
    for _ in range(repeat - 1):
        for row, fn in plan:
            _round(row, fn)
    if ref_outputs is None:
        ref_outputs = next(r.outputs for r in rows if r.name == "ours_single")[: len(ref_items)]
    peaks = device_peaks()
    return summarize(rows, target, items, ref_outputs, reference, surface, drafter, peaks)


def _curve(per_item: list[float], bins: int = 8) -> dict:
    """Mean accepted length over the job's first and later half (finish order) and over
    `bins` equal slices of it (empty for rows that did not speculate)."""
    if not per_item or all(x <= 1.0 for x in per_item):
        return {}
    n, half = len(per_item), len(per_item) // 2
    edges = [round(i * n / bins) for i in range(bins + 1)]
    mean = lambda xs: round(sum(xs) / len(xs), 3) if xs else None  # noqa: E731
    return {
        "accepted_length_first_half": mean(per_item[:half]),
        "accepted_length_later_half": mean(per_item[half:]),
        "accepted_length_curve": [mean(per_item[a:b]) for a, b in itertools.pairwise(edges)],
    }


def valid_answers(target: LoadedModel, items: list[Item], outputs: list[list[int]]) -> int:
    """Answers of the constrained items that parse as JSON and validate under their schema
    (the `jsonschema` package; `json_object`: any object). `outputs` may cover the first
    items only (a reference row run on `--reference-items`)."""
    import jsonschema

    from core.engine.grammar import schema_of

    valid = 0
    for it, out in zip(items[: len(outputs)], outputs, strict=True):
        if not it.response_format:
            continue
        try:
            jsonschema.validate(json.loads(target.decode(out)), schema_of(it.response_format))
        except (ValueError, jsonschema.ValidationError):
            continue
        valid += 1
    return valid


def summarize(rows, target, items, ref_outputs, reference, surface, drafter, peaks=None) -> dict:
    gaps: dict[tuple[int, int], float] = {}
    constrained = sum(bool(it.response_format) for it in items)

    checked = len(ref_outputs)

    def differing(outputs):
        out = []
        for i, (o, r) in enumerate(zip(outputs[:checked], ref_outputs, strict=True)):
            if o != r:
                j = first_difference(o, r)
                if (i, j) not in gaps:
                    gaps[(i, j)] = top_gap(target, items[i].prompt, r[:j])
                out.append(gaps[(i, j)])
        return out

    table = []
    for r in rows:
        free = r.name.startswith("ours_batched_free")  # other answers: nothing to compare
        d = [] if free else differing(r.outputs)
        table.append(
            {
                "name": r.name,
                "batch_size": r.batch_size,
                "tokens_per_s": round(r.tokens_per_s, 3),
                "tokens": r.tokens,
                "seconds": round(r.seconds, 3),
                "identical_rows": None if free else min(len(r.outputs), checked) - len(d),
                "identical_to_mlx_lm": None if free else not d,
                "max_gap": round(max(d), 4) if d else None,
                "gap_bug": bool(d) and max(d) > GAP_BUG,
                "drafters": dict(r.drafters),
                "mean_accepted_length": round(r.emitted / r.steps, 3) if r.steps else None,
                "acceptance_rate": round(r.accepted / r.drafted, 3) if r.drafted else None,
                **(
                    {
                        "valid_answers": valid_answers(target, items, r.outputs),
                        "forced_tokens": r.forced,
                        "mask_s": round(r.mask_s, 3),
                    }
                    if constrained and not r.name.startswith("ours_batched_free")
                    else {}
                ),
                **_curve(r.curve),
                **({"phases": r.phases} if r.phases is not None else {}),
                **(
                    {
                        "rounds_tokens_per_s": [round(r.tokens / x, 3) for x in r.rounds],
                        "items_changed_between_rounds": r.round_changed,
                    }
                    if len(r.rounds) > 1
                    else {}
                ),
            }
        )
    extra = sorted({t["name"].rsplit("_", 1)[0] + "_" for t in table if "_draft-" in t["name"]})
    if peaks is not None:
        for t in table:  # a step reads the weights once for its rows' accepted tokens
            per_step = t["batch_size"] * (t["mean_accepted_length"] or 1.0)
            lim = shares(t["tokens_per_s"], per_step, target.model, peaks)
            t["bandwidth_share"] = round(lim["bandwidth_share"], 4)
            t["compute_share"] = round(lim["compute_share"], 4)
    ours = [t for t in table if t["name"].startswith("ours_") and "_free" not in t["name"]]
    for prefix in ("mlx_lm_batch_", "ours_batched_spec_", "ours_batched_", *extra):
        cands = [
            t for t in table if t["name"].startswith(prefix) and t["name"][len(prefix) :].isdigit()
        ]
        if cands:
            best = max(cands, key=lambda t: t["tokens_per_s"])
            table.append({**best, "name": prefix.rstrip("_"), "config": best["name"]})
    if ours:
        best = max(ours, key=lambda t: t["tokens_per_s"])
        table.append({**best, "name": "ours_best", "config": best["name"]})
    best_mlx = next((t["tokens_per_s"] for t in table if t["name"] == "mlx_lm_batch"), None)
    mlx_spec = next((t["tokens_per_s"] for t in table if t["name"] == "mlx_lm_spec"), None)
    for t in table:
        t["ratio_vs_mlx_lm"] = round(t["tokens_per_s"] / best_mlx, 3) if best_mlx else None
        if mlx_spec:
            t["ratio_vs_mlx_lm_spec"] = round(t["tokens_per_s"] / mlx_spec, 3)
    return {
        "model": target.name,
        "weight_format": target.weight_format,
        "device": str(mx.default_device()),
        "machine": platform.machine(),
        "items": len(items),
        "prompt_tokens": [min(len(i.prompt) for i in items), max(len(i.prompt) for i in items)],
        "distinct_prompt_lengths": len({len(i.prompt) for i in items}),
        "max_tokens": max(i.max_tokens for i in items),
        "drafter": drafter,
        "reference": reference,
        "reference_items": checked,
        "constrained_items": constrained,
        "cost_surface_ms": surface.to_json(),
        **(
            {
                "peaks": {
                    "bandwidth_bytes_per_s": peaks.bandwidth,
                    "flops_per_s": peaks.flops,
                    "source": peaks.source,
                }
            }
            if peaks is not None
            else {}
        ),
        "rows": table,
        **({"round_ratios": _round_ratios(rows)} if any(len(r.rounds) > 1 for r in rows) else {}),
    }


def _round_ratios(rows: list[Row]) -> list[dict]:
    """Per round (the rounds ran them in turn) and the median of those: the speculative
    row's tokens/s over plain's and over each other drafter's, and each other drafter's over
    plain's, at each batch size."""
    out = []
    plain = {r.batch_size: r for r in rows if r.name == f"ours_batched_{r.batch_size}"}
    drafts = [r for r in rows if r.name.startswith("ours_batched_draft-")]
    free = {r.batch_size: r for r in rows if r.name == f"ours_batched_free_{r.batch_size}"}
    for a in rows:
        bs = a.batch_size
        others = [plain[bs]] if bs in plain else []
        if a.name == f"ours_batched_spec_{bs}":
            others += [r for r in drafts if r.batch_size == bs]
        elif a.name == f"ours_batched_{bs}":  # constrained plain over unconstrained plain
            others = [free[bs]] if bs in free else []
        elif a not in drafts:
            continue
        for b in others:
            per = [(a.tokens / x) / (b.tokens / y) for x, y in zip(a.rounds, b.rounds, strict=True)]
            out.append(
                {
                    "name": a.name,
                    "over": b.name,
                    "per_round": [round(v, 3) for v in per],
                    "median": round(statistics.median(per), 3),
                }
            )
    return out


def format_table(result: dict) -> str:
    lines = [
        f"model {result['model']} ({result['weight_format']}) on {result['device']}, "
        f"{result['items']} items ({result['distinct_prompt_lengths']} prompt lengths), "
        f"max_tokens {result['max_tokens']}, drafter {result['drafter']}, "
        f"reference {result['reference']} on the first {result['reference_items']} items",
        f"{'config':<34}{'batch':>6}{'tok/s':>10}{'vs mlx-lm':>11}{'identical':>11}"
        f"{'max gap':>9}{'acc len':>9}{'bw':>7}{'flops':>7}  drafters",
    ]
    for r in result["rows"]:
        name = r["name"] + (f" ({r['config']})" if "config" in r else "")
        ratio = f"{r['ratio_vs_mlx_lm']:.2f}x" if r["ratio_vs_mlx_lm"] is not None else "-"
        gap = f"{r['max_gap']:.3f}" if r["max_gap"] is not None else "-"
        if r["gap_bug"]:
            gap += "!"
        mal = f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"
        mix = ", ".join(f"{k} {v}" for k, v in sorted(r["drafters"].items())) or "-"
        bw = f"{r['bandwidth_share']:.1%}" if "bandwidth_share" in r else "-"
        fl = f"{r['compute_share']:.1%}" if "compute_share" in r else "-"
        same = "-" if r["identical_rows"] is None else r["identical_rows"]
        lines.append(
            f"{name:<34}{r['batch_size']:>6}{r['tokens_per_s']:>10.2f}{ratio:>11}"
            f"{same:>6}/{result['reference_items']:<4}{gap:>9}{mal:>9}"
            f"{bw:>7}{fl:>7}  {mix}"
        )
    best = next((r for r in result["rows"] if r["name"] == "ours_best"), None)
    if best and "ratio_vs_mlx_lm_spec" in best:
        lines.append(
            f"ours_best ({best['config']}) / mlx_lm_spec: {best['ratio_vs_mlx_lm_spec']:.2f}x"
        )
    if "peaks" in result:
        p = result["peaks"]
        lines.append(
            f"limits ({p['source']}): {p['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s, "
            f"{p['flops_per_s'] / 1e12:.2f} TFLOP/s; bw = weight bytes read per step x steps/s "
            "over the bandwidth, flops = 2 x weights x tokens/s over the compute peak"
        )
    if result.get("constrained_items"):
        lines.append(
            f"structured output: {result['constrained_items']} items with a response_format "
            "(ours_batched_free: the same job with them dropped, each answer capped at its "
            "constrained length)"
        )
        for r in result["rows"]:
            if "valid_answers" in r and "config" not in r:
                steps = r["mean_accepted_length"]
                lines.append(
                    f"  {r['name']:<32} valid {r['valid_answers']}/{result['constrained_items']}"
                    f"  forced tokens {r['forced_tokens']}  mask {r['mask_s']:.2f} s"
                    + (f"  tokens a verify step {steps:.2f}" if steps else "")
                )
    for r in result["rows"]:
        if "rounds_tokens_per_s" in r and "config" not in r:
            n = r["items_changed_between_rounds"]
            same = f"  ({n} items' outputs changed between rounds)" if n else ""
            per = " ".join(f"{x:.1f}" for x in r["rounds_tokens_per_s"])
            lines.append(f"  {r['name']:<32} tok/s by round: {per}{same}")
    for q in result.get("round_ratios", []):
        per = " ".join(f"{x:.2f}" for x in q["per_round"])
        lines.append(f"  {q['name']} / {q['over']}: {per}   median {q['median']:.2f}x")
    lines += format_surface(result["cost_surface_ms"])
    curves = [r for r in result["rows"] if r.get("accepted_length_curve") and "config" not in r]
    if curves:
        lines.append("mean accepted length by position in the job (finish order, eighths):")
        for r in curves:
            c = " ".join(
                f"{x:5.2f}" if x is not None else "    -" for x in r["accepted_length_curve"]
            )
            lines.append(
                f"  {r['name']:<32} {c}   first half {r['accepted_length_first_half']:.2f}"
                f", later half {r['accepted_length_later_half']:.2f}"
            )
    return "\n".join(lines)
