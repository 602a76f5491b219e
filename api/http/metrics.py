"""`/metrics` for Prometheus, computed from the store at scrape time.

Speculative-decoding counters keep vLLM's names (`vllm:spec_decode_*`, per model as
`model_name`), so dashboards built for vLLM read them unchanged; queue depth uses vLLM's
`vllm:num_requests_waiting` / `_running` too. AppleSpec's own series are `applespec_*`.
Every value comes from SQL at scrape time (a finished job's sums are kept between scrapes),
so any number of servers agree.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select

from core.store import job_series
from core.store.models import JOB_DONE, Item, Job, Metric, utcnow
from core.store.repo import aware

router = APIRouter()

RATE_WINDOW_S = 60  # applespec_tokens_per_second: completion tokens of the last minute


def _empty() -> dict[str, Any]:
    return {"drafts": 0, "draft": 0, "accepted": 0, "emitted": 0, "per_position": []}


def _add(into: dict[str, Any], t: dict[str, Any]) -> None:
    for key in ("drafts", "draft", "accepted", "emitted"):
        into[key] += t[key]
    for i, n in enumerate(t["per_position"]):
        if i >= len(into["per_position"]):
            into["per_position"].append(0)
        into["per_position"][i] += n


def job_spec_totals(session, job_id: str) -> dict[str, Any]:
    """One job's drafts, draft/accepted/emitted tokens and accepted tokens per position."""
    t = _empty()
    rows = session.execute(
        select(
            Metric.completion_tokens,
            Metric.draft_tokens,
            Metric.accepted_tokens,
            Metric.verify_steps,
            Metric.speculative,
        )
        .join(Item, Item.id == Metric.item_id)
        .where(Item.job_id == job_id)
        .execution_options(yield_per=2000)
    )
    for emitted, drafted, accepted, steps, spec in rows:
        spec = spec or {}
        # A draft = a verify step that checked drafted tokens (plain steps are "none").
        plain = (spec.get("steps_by_drafter") or {}).get("none", 0)
        _add(
            t,
            {
                "emitted": emitted or 0,
                "draft": drafted or 0,
                "accepted": accepted or 0,
                "drafts": max((steps or 0) - plain, 0) if drafted else 0,
                "per_position": [int(n) for n in spec.get("accepted_per_position") or ()],
            },
        )
    return t


class SpecDecodeTotals:
    """Per-model sums over every metrics row, kept per job between scrapes.

    A job's metrics rows are written in the transaction that recounts it, so a job whose
    counts are unchanged has the same rows: only jobs that moved are read again.
    """

    def __init__(self):
        self._jobs: dict[str, tuple[tuple, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def __call__(self, session, jobs) -> dict[str, dict[str, Any]]:
        totals: dict[str, dict[str, Any]] = defaultdict(_empty)
        with self._lock:
            for job in jobs:
                signature = (job.completed, job.failed, job.total, job.status)
                cached = self._jobs.get(job.id)
                if cached is None or cached[0] != signature:
                    cached = (signature, job_spec_totals(session, job.id))
                    self._jobs[job.id] = cached
                _add(totals[job.model], cached[1])
        return dict(totals)


class StoreCollector:
    """A prometheus-client collector reading the store (and the broker monitor) per scrape."""

    def __init__(self, reader, monitor=None):
        self.reader, self.monitor = reader, monitor
        self.spec_totals = SpecDecodeTotals()

    def collect(self):
        labels = ["model_name"]
        with self.reader() as s:
            jobs = s.execute(
                select(
                    Job.id,
                    Job.model,
                    Job.status,
                    Job.total,
                    Job.completed,
                    Job.failed,
                    func.coalesce(Job.completed_at, Job.failed_at, Job.cancelled_at).label("end"),
                )
            ).all()
            spec = self.spec_totals(s, jobs)
            since = utcnow() - timedelta(seconds=RATE_WINDOW_S)
            # Only jobs running or finished within the window can have recent rows.
            live = [
                j.id
                for j in jobs
                if j.status not in JOB_DONE or (j.end is not None and aware(j.end) >= since)
            ]
            recent = s.execute(
                select(Job.model, func.sum(Metric.completion_tokens))
                .join(Item, Item.id == Metric.item_id)
                .join(Job, Job.id == Item.job_id)
                .where(Job.id.in_(live), Metric.created_at >= since)
                .group_by(Job.model)
            ).all()
            work = job_series.open_work(s)
            # A sum over every measured request (an index-free scan of metrics per scrape).
            energy = s.execute(
                select(
                    Job.model,
                    Metric.worker_host,
                    func.sum(Metric.energy_j),
                    func.sum(Metric.completion_tokens),
                )
                .join(Item, Item.id == Metric.item_id)
                .join(Job, Job.id == Item.job_id)
                .where(Metric.energy_j.is_not(None))
                .group_by(Job.model, Metric.worker_host)
            ).all()

        joules = CounterMetricFamily(
            "applespec_energy_joules",
            "Energy measured while requests ran (NVML or RAPL; requests not measured are "
            "left out), per model and worker host.",
            labels=["model_name", "worker_host"],
        )
        measured_tokens = CounterMetricFamily(
            "applespec_energy_measured_tokens",
            "Completion tokens of the requests whose energy was measured (joules per token = "
            "applespec_energy_joules / this).",
            labels=["model_name", "worker_host"],
        )
        for model, host, j, tokens in energy:
            joules.add_metric([model, host], j or 0.0)
            measured_tokens.add_metric([model, host], tokens or 0)
        yield joules
        yield measured_tokens

        families = {
            "drafts": CounterMetricFamily(
                "vllm:spec_decode_num_drafts",
                "Verify steps that checked drafted tokens.",
                labels=labels,
            ),
            "draft": CounterMetricFamily(
                "vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.", labels=labels
            ),
            "accepted": CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens", "Draft tokens accepted.", labels=labels
            ),
            "emitted": CounterMetricFamily(
                "vllm:spec_decode_num_emitted_tokens",
                "Tokens emitted (accepted drafts plus the target's own tokens).",
                labels=labels,
            ),
        }
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each draft position (0 = the first drafted token).",
            labels=["model_name", "position"],
        )
        for model, t in sorted(spec.items()):
            for key, family in families.items():
                family.add_metric([model], t[key])
            # position 0 always: a model whose items never drafted has the series, at 0
            for i, n in enumerate(t["per_position"] or [0]):
                per_pos.add_metric([model, str(i)], n)
        yield from families.values()
        yield per_pos

        pending: dict[str, int] = defaultdict(int)
        active: dict[str, int] = defaultdict(int)
        for w in work:
            pending[w["model"]] += w["pending"]
            active[w["model"]] += w["running"]
        # From the jobs' own counts (no item scan): total = completed + failed (bad lines
        # included) + cancelled + pending + running.
        by_status: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for job in jobs:
            c = by_status[job.model]
            c["completed"] += job.completed
            c["failed"] += job.failed
            c["rest"] += job.total - job.completed - job.failed
        for model, c in by_status.items():
            c["cancelled"] = c.pop("rest") - pending.get(model, 0) - active.get(model, 0)
        done = {
            "completed": ("applespec_items_completed", "Items completed."),
            "failed": (
                "applespec_items_failed",
                "Items failed, bad input lines included (as request_counts.failed).",
            ),
            "cancelled": ("applespec_items_cancelled", "Items cancelled."),
        }
        for status, (name, doc) in done.items():
            family = CounterMetricFamily(name, doc, labels=labels)
            for model, c in sorted(by_status.items()):
                family.add_metric([model], c[status])
            yield family
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Items queued, not started.", labels=labels
        )
        running = GaugeMetricFamily("vllm:num_requests_running", "Items running.", labels=labels)
        depth = GaugeMetricFamily(
            "applespec_queue_depth", "Items waiting for a worker, per model.", labels=labels
        )
        for model in sorted(set(pending) | set(by_status)):
            waiting.add_metric([model], pending.get(model, 0))
            running.add_metric([model], active.get(model, 0))
            depth.add_metric([model], pending.get(model, 0))
        yield waiting
        yield running
        yield depth
        rate = GaugeMetricFamily(
            "applespec_tokens_per_second",
            f"Completion tokens per second over the last {RATE_WINDOW_S} s.",
            labels=labels,
        )
        recent_by_model = dict(recent)
        for model in sorted(set(by_status) | set(recent_by_model)):
            rate.add_metric([model], (recent_by_model.get(model) or 0) / RATE_WINDOW_S)
        yield rate
        if self.monitor is not None:
            snap = self.monitor.snapshot()
            if snap.get("checked_at") is not None:
                online = GaugeMetricFamily(
                    "applespec_workers_online", "Celery workers answering inspect."
                )
                online.add_metric([], len(snap.get("workers") or ()))
                yield online
                chunks = GaugeMetricFamily(
                    "applespec_queue_chunks",
                    "Chunks (tasks) in each broker queue.",
                    labels=["queue"],
                )
                for queue, n in sorted((snap.get("queues") or {}).items()):
                    chunks.add_metric([queue], n)
                yield chunks


def registry_for(reader, monitor=None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(reader, monitor))
    return registry


@router.get("/metrics")
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)
