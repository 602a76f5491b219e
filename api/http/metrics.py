"""`/metrics` for Prometheus, computed from the store at scrape time.

Speculative-decoding counters keep vLLM's names (`vllm:spec_decode_*`, per model as
`model_name`), so dashboards built for vLLM read them unchanged; queue depth uses vLLM's
`vllm:num_requests_waiting` / `_running` too. AppleSpec's own series are `applespec_*`.
Every value is recomputed from SQL at each scrape, so any number of servers agree.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from sqlalchemy import func, select

from core.store import job_series
from core.store.models import Item, Job, Metric, utcnow

router = APIRouter()

RATE_WINDOW_S = 60  # applespec_tokens_per_second: completion tokens of the last minute


def spec_decode_totals(session) -> dict[str, dict[str, Any]]:
    """Per model: drafts, draft/accepted/emitted tokens and accepted tokens per position."""
    totals: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"drafts": 0, "draft": 0, "accepted": 0, "emitted": 0, "per_position": []}
    )
    rows = session.execute(
        select(
            Job.model,
            Metric.completion_tokens,
            Metric.draft_tokens,
            Metric.accepted_tokens,
            Metric.verify_steps,
            Metric.speculative,
        )
        .join(Item, Item.id == Metric.item_id)
        .join(Job, Job.id == Item.job_id)
        .execution_options(yield_per=2000)
    )
    for model, emitted, drafted, accepted, steps, spec in rows:
        t = totals[model]
        t["emitted"] += emitted or 0
        t["draft"] += drafted or 0
        t["accepted"] += accepted or 0
        spec = spec or {}
        # A draft = a verify step that checked drafted tokens (plain steps are "none").
        plain = (spec.get("steps_by_drafter") or {}).get("none", 0)
        t["drafts"] += max((steps or 0) - plain, 0) if drafted else 0
        for i, n in enumerate(spec.get("accepted_per_position") or ()):
            if i >= len(t["per_position"]):
                t["per_position"].append(0)
            t["per_position"][i] += int(n)
    return dict(totals)


class StoreCollector:
    """A prometheus-client collector reading the store (and the broker monitor) per scrape."""

    def __init__(self, reader, monitor=None):
        self.reader, self.monitor = reader, monitor

    def collect(self):
        labels = ["model_name"]
        with self.reader() as s:
            spec = spec_decode_totals(s)
            counts = s.execute(
                select(Job.model, Item.status, func.count())
                .join(Item, Item.job_id == Job.id)
                .group_by(Job.model, Item.status)
            ).all()
            since = utcnow() - timedelta(seconds=RATE_WINDOW_S)
            recent = s.execute(
                select(Job.model, func.sum(Metric.completion_tokens))
                .join(Item, Item.id == Metric.item_id)
                .join(Job, Job.id == Item.job_id)
                .where(Metric.created_at >= since)
                .group_by(Job.model)
            ).all()
            work = job_series.open_work(s)

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
            for i, n in enumerate(t["per_position"]):
                per_pos.add_metric([model, str(i)], n)
        yield from families.values()
        yield per_pos

        by_status: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for model, status, n in counts:
            by_status[model][status] += n
        done = {
            "completed": ("applespec_items_completed", "Items completed.", ("completed",)),
            "failed": (
                "applespec_items_failed",
                "Items failed, bad input lines included (as request_counts.failed).",
                ("failed", "invalid"),
            ),
            "cancelled": ("applespec_items_cancelled", "Items cancelled.", ("cancelled",)),
        }
        for name, doc, statuses in done.values():
            family = CounterMetricFamily(name, doc, labels=labels)
            for model, c in sorted(by_status.items()):
                family.add_metric([model], sum(c[st] for st in statuses))
            yield family
        waiting = GaugeMetricFamily(
            "vllm:num_requests_waiting", "Items queued, not started.", labels=labels
        )
        running = GaugeMetricFamily("vllm:num_requests_running", "Items running.", labels=labels)
        depth = GaugeMetricFamily(
            "applespec_queue_depth", "Items waiting for a worker, per model.", labels=labels
        )
        pending: dict[str, int] = defaultdict(int)
        active: dict[str, int] = defaultdict(int)
        for w in work:
            pending[w["model"]] += w["pending"]
            active[w["model"]] += w["running"]
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
