"""What the dashboard's job page and `applespec report` plot, read from a job's metrics rows.

One function computes every figure's data, so the live page and the mailed report show the
same numbers: acceptance over the items in the order they finished, accepted tokens per
draft position, the draft / verify / accept / cache time split, tokens/s per worker host, queue
wait, and the engine's batch size when it reports one (`timing.batch_size`).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from . import repo
from .batches import Batch
from .models import JOB_DONE, Item, Job, Metric

PHASES = ("draft_s", "verify_s", "accept_s", "cache_s")
MAX_POINTS = 2000  # per-item series longer than this are averaged in equal buckets


def job_series(session: Session, job_id: str, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """Every figure's data for one job, plus its `applespec status --json` summary.

    Returns:
        A JSON-ready dict: `summary` (repo.job_summary), `items` (per item in finish order,
        bucketed past `max_points`: acceptance, cumulative acceptance, queue wait, batch
        size), `per_position`, `time_split`, `workers` and a few `totals`.
    """
    summary = repo.job_summary(session, job_id)
    rows = session.execute(
        select(
            Item.finished_at,
            Item.started_at,
            Metric.worker_host,
            Metric.draft_tokens,
            Metric.accepted_tokens,
            Metric.completion_tokens,
            Metric.queue_wait_s,
            Metric.total_s,
            Metric.draft_s,
            Metric.verify_s,
            Metric.accept_s,
            Metric.cache_s,
            Metric.speculative,
            Metric.timing,
            Metric.energy_j,
        )
        .join(Metric, Metric.item_id == Item.id)
        .where(Item.job_id == job_id)
        .order_by(Item.finished_at, Item.id)
        .execution_options(yield_per=1000)
    )
    acceptance: list[float | None] = []
    cumulative: list[float | None] = []
    waits: list[float | None] = []
    energy: list[float | None] = []  # joules per 1k completion tokens, per item
    batch_sizes: list[float | None] = []
    per_position: list[int] = []
    phases = dict.fromkeys(PHASES, 0.0)
    engine_s = 0.0
    workers: dict[str, dict[str, Any]] = {}
    drafted = accepted = 0
    for r in rows:
        d, a = r.draft_tokens or 0, r.accepted_tokens or 0
        drafted, accepted = drafted + d, accepted + a
        acceptance.append(a / d if d else None)
        cumulative.append(accepted / drafted if drafted else None)
        waits.append(r.queue_wait_s)
        energy.append(repo.per_1k(r.energy_j, r.completion_tokens or 0))
        size = (r.timing or {}).get("batch_size")
        batch_sizes.append(float(size) if isinstance(size, int | float) else None)
        for i, n in enumerate((r.speculative or {}).get("accepted_per_position") or ()):
            if i >= len(per_position):
                per_position.append(0)
            per_position[i] += int(n)
        for p in PHASES:
            phases[p] += getattr(r, p) or 0.0
        engine_s += r.total_s or 0.0
        # worker_host is host:pid; a host's processes together are what its machine did.
        host = r.worker_host.rsplit(":", 1)[0]
        w = workers.setdefault(
            host,
            {
                "tokens": 0,
                "items": 0,
                "engine_s": 0.0,
                "first": None,
                "last": None,
                "pids": set(),
                "joules": None,
            },
        )
        if r.energy_j is not None:
            w["joules"] = (w["joules"] or 0.0) + r.energy_j
        w["pids"].add(r.worker_host)
        w["tokens"] += r.completion_tokens or 0
        w["items"] += 1
        w["engine_s"] += r.total_s or 0.0
        start, end = repo.aware(r.started_at), repo.aware(r.finished_at)
        if start and (w["first"] is None or start < w["first"]):
            w["first"] = start
        if end and (w["last"] is None or end > w["last"]):
            w["last"] = end
    n = len(acceptance)
    other = max(engine_s - sum(phases.values()), 0.0)
    return {
        "summary": summary,
        "items": {
            "count": n,
            "bucket": _bucket_size(n, max_points),
            "acceptance": _buckets(acceptance, max_points),
            "cumulative_acceptance": _buckets(cumulative, max_points),
            "queue_wait_s": _buckets(waits, max_points),
            "joules_per_1k_tokens": _buckets(energy, max_points)
            if any(e is not None for e in energy)
            else None,
            "batch_size": _buckets(batch_sizes, max_points)
            if any(b is not None for b in batch_sizes)
            else None,
        },
        "per_position": per_position,
        "time_split": {**{p.removesuffix("_s"): phases[p] for p in PHASES}, "other": other},
        "workers": [
            {
                "host": host,
                "processes": len(w["pids"]),
                "items": w["items"],
                "tokens": w["tokens"],
                # Wall-clock over the host's span in this job: right under batching too.
                "tokens_per_s": w["tokens"] / span if (span := _span(w)) > 0 else None,
                "engine_tokens_per_s": w["tokens"] / w["engine_s"] if w["engine_s"] > 0 else None,
                "joules": w["joules"],  # None: not measured
            }
            for host, w in sorted(workers.items())
        ],
        "totals": {
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "mean_queue_wait_s": _mean(waits),
            "max_queue_wait_s": max((w for w in waits if w is not None), default=None),
            "mean_batch_size": _mean(batch_sizes),
        },
    }


def jobs_overview(
    session: Session, limit: int = 50, key_id: str | None = None
) -> list[dict[str, Any]]:
    """The most recent jobs with their counts, tokens/s, acceptance and ETA (the dashboard
    list); with `key_id`, only that API key's batches."""
    if key_id is None:
        jobs = repo.list_jobs(session, limit)
    else:
        jobs = list(
            session.scalars(
                select(Job)
                .join(Batch, Batch.id == Job.id)
                .where(Batch.key_id == key_id)
                .order_by(Job.created_at.desc())
                .limit(limit)
            )
        )
    ids = [j.id for j in jobs]
    sums = {
        job_id: (tokens or 0, drafted or 0, accepted or 0, measured or 0, joules)
        for job_id, tokens, drafted, accepted, measured, joules in session.execute(
            select(
                Item.job_id,
                func.sum(Metric.completion_tokens),
                func.sum(Metric.draft_tokens),
                func.sum(Metric.accepted_tokens),
                func.count(Metric.id),
                func.sum(Metric.energy_j),
            )
            .join(Metric, Metric.item_id == Item.id)
            .where(Item.job_id.in_(ids))
            .group_by(Item.job_id)
        )
    }
    open_items = dict(
        session.execute(
            select(Item.job_id, func.count())
            .where(Item.job_id.in_(ids), Item.status.in_(("pending", "running")))
            .group_by(Item.job_id)
        ).all()
    )
    now = repo.utcnow()
    out = []
    for j in jobs:
        tokens, drafted, accepted, measured, joules = sums.get(j.id, (0, 0, 0, 0, None))
        start = repo.aware(j.in_progress_at or j.created_at)
        end = repo.aware(j.completed_at or j.failed_at or j.cancelled_at) or now
        wall = max((end - start).total_seconds(), 0.0)
        out.append(
            {
                "id": j.id,
                "status": j.status,
                "mode": j.mode,
                "model": j.model,
                "created_at": repo.aware(j.created_at).isoformat(),
                "request_counts": {"total": j.total, "completed": j.completed, "failed": j.failed},
                "completion_tokens": tokens,
                "tokens_per_s": tokens / wall if wall > 0 and tokens else None,
                "acceptance_rate": accepted / drafted if drafted else None,
                "energy_j": joules,  # None: not measured
                "eta_s": repo.eta(j.status, open_items.get(j.id, 0), measured, tokens, wall)[
                    "seconds"
                ],
            }
        )
    return out


def open_work(session: Session) -> list[dict[str, Any]]:
    """Items pending and running per model and queue, over the unfinished jobs.

    A finished job has no open items (its status is derived from them), so only unfinished
    jobs' items are counted, through the (job_id, status) index.
    """
    rows = session.execute(
        select(Job.model, Job.queue, Item.status, func.count())
        .join(Item, Item.job_id == Job.id)
        .where(Job.status.not_in(JOB_DONE), Item.status.in_(("pending", "running")))
        .group_by(Job.model, Job.queue, Item.status)
    )
    work: dict[tuple[str, str | None], dict[str, Any]] = {}
    for model, queue, status, count in rows:
        entry = work.setdefault(
            (model, queue), {"model": model, "queue": queue, "pending": 0, "running": 0}
        )
        entry[status] += count
    return sorted(work.values(), key=lambda e: e["model"])


def _span(w: dict[str, Any]) -> float:
    if w["first"] is None or w["last"] is None:
        return 0.0
    return (w["last"] - w["first"]).total_seconds()


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def _bucket_size(n: int, max_points: int) -> int:
    return max(1, -(-n // max_points))


def _buckets(values: list[float | None], max_points: int) -> list[float | None]:
    size = _bucket_size(len(values), max_points)
    if size == 1:
        return values
    return [_mean(values[i : i + size]) for i in range(0, len(values), size)]
