"""`applespec report JOB -o report.html`: one self-contained HTML file with a job's figures.

The figures are the dashboard's job page (core.store.job_series), drawn by matplotlib as
PNGs embedded in the page; the summary table is `applespec status --json`, value for value.
Nothing is loaded from anywhere when the file is opened, so it can be mailed.
"""

from __future__ import annotations

import base64
import html
import io
import json
from typing import Any

import click

from core.settings import Settings

# (key in `status --json`, label): the report's summary table, in order.
SUMMARY_ROWS = (
    ("status", "status"),
    ("model", "model"),
    ("drafter", "drafter"),
    ("mode", "mode"),
    ("created_at", "created"),
    ("request_counts.total", "requests"),
    ("request_counts.completed", "completed"),
    ("request_counts.failed", "failed"),
    ("metrics.items_measured", "items measured"),
    ("metrics.completion_tokens", "completion tokens"),
    ("metrics.wall_s", "wall time (s)"),
    ("metrics.engine_s", "engine time (s)"),
    ("metrics.tokens_per_s", "tokens/s (wall)"),
    ("metrics.engine_tokens_per_s", "tokens/s (engine)"),
    ("metrics.acceptance_rate", "acceptance rate"),
    ("metrics.mean_accepted_length", "mean accepted length"),
    ("metrics.forced_tokens", "tokens forced by the schema"),
    ("metrics.mask_s", "grammar mask time (s)"),
    ("energy.joules", "energy (J)"),
    ("energy.joules_per_1k_tokens", "energy per 1k tokens (J)"),
    ("eta.seconds", "ETA (s)"),
)


def lookup(summary: dict[str, Any], dotted: str) -> Any:
    value: Any = summary
    for part in dotted.split("."):
        value = value[part]
    return value


def _shown(value: Any, key: str = "") -> str:
    if value is None:
        return "not measured" if key.startswith("energy.") else "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def figures(series: dict[str, Any]) -> list[tuple[str, bytes]]:
    """The job's figures as (title, PNG bytes), the same ones as its dashboard page."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    items = series["items"]
    bucket = items["bucket"]
    x = [(i + 1) * bucket for i in range(len(items["acceptance"]))]
    xlabel = "item (finish order)" + (f", means of {bucket}" if bucket > 1 else "")
    out = []

    def emit(title: str, draw) -> None:
        fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=110)
        if not draw(ax):
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
        ax.set_title(title, fontsize=11, loc="left")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        plt.close(fig)
        out.append((title, buf.getvalue()))

    def points(values):
        return [(a, v) for a, v in zip(x, values, strict=True) if v is not None]

    def acceptance(ax) -> bool:
        per, cum = points(items["acceptance"]), points(items["cumulative_acceptance"])
        if not per:
            return False
        ax.scatter(*zip(*per, strict=True), s=8, label="per item", color="#3b6fd4")
        ax.plot(*zip(*cum, strict=True), label="cumulative", color="#e0803a")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accepted / drafted")
        ax.legend(loc="lower right", fontsize=8)
        return True

    def positions(ax) -> bool:
        counts = series["per_position"]
        if not counts:
            return False
        ax.bar(range(1, len(counts) + 1), counts, color="#3b6fd4")
        ax.set_xlabel("draft position")
        ax.set_ylabel("accepted tokens")
        return True

    def time_split(ax) -> bool:
        split = {k: v for k, v in series["time_split"].items() if v > 0}
        if not split:
            return False
        ax.barh(list(split), list(split.values()), color="#46a35e")
        ax.invert_yaxis()
        ax.set_xlabel("seconds (sum over items)")
        return True

    def workers(ax) -> bool:
        rows = [w for w in series["workers"] if w["tokens_per_s"] is not None]
        if not rows:
            return False
        ax.bar([w["host"] for w in rows], [w["tokens_per_s"] for w in rows], color="#b34ea8")
        ax.set_ylabel("tokens/s")
        ax.tick_params(axis="x", labelsize=7)
        return True

    def queue_wait(ax) -> bool:
        waits = points(items["queue_wait_s"])
        if not waits:
            return False
        ax.plot(*zip(*waits, strict=True), color="#8c8c8c")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("seconds")
        ax.set_ylim(bottom=0)
        return True

    emit("Acceptance rate over items, in finish order", acceptance)
    emit("Accepted tokens per draft position", positions)
    emit("Engine time split", time_split)
    emit("Tokens/s per worker host", workers)
    emit("Queue wait per item, in finish order", queue_wait)
    if items["batch_size"] is not None:

        def batch(ax) -> bool:
            sizes = points(items["batch_size"])
            ax.plot(*zip(*sizes, strict=True), color="#c94c4c")
            ax.set_xlabel(xlabel)
            ax.set_ylabel("rows in the item's batch")
            return True

        emit("Batch size per item, in finish order", batch)
    return out


def render(series: dict[str, Any], figs: list[tuple[str, bytes]]) -> str:
    """The report's HTML: summary table (exact values in data-value), figures as data: URIs."""
    summary = series["summary"]
    rows = "\n".join(
        f'<tr data-key="{key}" data-value="{html.escape(json.dumps(lookup(summary, key)))}">'
        f"<th>{label}</th><td>{html.escape(_shown(lookup(summary, key), key))}</td></tr>"
        for key, label in SUMMARY_ROWS
    )
    images = "\n".join(
        f'<figure><img alt="{html.escape(title)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}"></figure>'
        for title, png in figs
    )
    t = series["totals"]
    extra = (
        f"{t['draft_tokens']} draft tokens, {t['accepted_tokens']} accepted; queue wait mean "
        f"{_shown(t['mean_queue_wait_s'])} s, max {_shown(t['max_queue_wait_s'])} s"
    )
    if t["mean_batch_size"] is not None:
        extra += f"; mean batch size {_shown(t['mean_batch_size'])}"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(summary["id"])} · AppleSpec report</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; color: #1d2433; margin: 24px; max-width: 1100px; }}
table {{ border-collapse: collapse; margin-bottom: 16px; }}
th, td {{ text-align: left; padding: 3px 14px 3px 0; border-bottom: 1px solid #e5e7eb; }}
th {{ color: #6b7280; font-weight: 600; }}
.figures {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(480px, 1fr)); gap: 12px; }}
figure {{ margin: 0; }} img {{ width: 100%; border: 1px solid #e5e7eb; border-radius: 6px; }}
</style></head>
<body>
<h1>{html.escape(summary["id"])}</h1>
<table id="summary">
{rows}
</table>
<p>{html.escape(extra)}</p>
<div class="figures">
{images}
</div>
<script type="application/json" id="status-json">{html.escape(json.dumps(summary))}</script>
</body></html>
"""


@click.command("report")
@click.argument("job_id")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="HTML file.")
def report_cmd(job_id: str, output: str) -> None:
    """Write a job's report: a self-contained HTML file with its figures.

    Acceptance over the items in finish order, accepted tokens per draft position, the
    draft / verify / accept / cache time split, tokens/s per worker host and queue wait, as
    embedded PNGs, above the numbers of `applespec status JOB --json`.

    \b
    Example:
        applespec report batch_0123abcd -o report.html
    """
    from api.openers import open_output, open_store
    from core.store import job_series, repo

    with open_store(Settings.from_env(), readonly=True)() as s:
        try:
            series = job_series.job_series(s, job_id)
        except repo.UnknownJob as e:
            raise click.ClickException(str(e)) from e
    figs = figures(series)
    with open_output(output) as f:
        f.write(render(series, figs))
    click.echo(f"{output}: {len(figs)} figures, {job_id} {series['summary']['status']}", err=True)
