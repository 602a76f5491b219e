"""The dashboard: `/` (jobs, workers, queues) and `/jobs/{id}` (one job's figures).

Pages are rendered by Jinja2 with the data they show, then poll the JSON routes below
(`/dashboard/state`, `/dashboard/jobs/{id}`) and update in place: progress bars and charts
move without a reload. Chart.js is served from this package (no CDN).

The dashboard is the farm's view: it shows every job's id, counts and speculation metrics,
never a prompt or an output, and needs no API key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from core.store import job_series, repo

from .errors import not_found

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
router = APIRouter()


def farm_state(request: Request, limit: int = 50) -> dict[str, Any]:
    """Jobs, workers online and queue depth per model: what `/` shows."""
    state = request.app.state
    with state.reader() as s:
        jobs = job_series.jobs_overview(s, limit)
        work = job_series.open_work(s)
    snap = state.monitor.snapshot() if state.monitor is not None else {}
    depth = snap.get("queues") or {}
    queues = {w["queue"]: dict(w, chunks=depth.get(w["queue"])) for w in work}
    for worker in snap.get("workers") or ():
        for q in worker["queues"]:
            queues.setdefault(
                q,
                {
                    "model": q.removeprefix("applespec."),
                    "queue": q,
                    "pending": 0,
                    "running": 0,
                    "chunks": depth.get(q),
                },
            )
    for q, entry in queues.items():
        entry["workers"] = sum(q in w["queues"] for w in snap.get("workers") or ())
    return {
        "jobs": jobs,
        "workers": snap.get("workers") or [],
        "workers_checked_at": snap.get("checked_at"),
        "broker_error": snap.get("error"),
        "queues": sorted(queues.values(), key=lambda e: (e["model"], e["queue"] or "")),
    }


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "index.html", {"state": farm_state(request)})


@router.get("/dashboard/state")
def state_json(request: Request) -> dict[str, Any]:
    return farm_state(request)


def _series(request: Request, job_id: str) -> dict[str, Any]:
    with request.app.state.reader() as s:
        try:
            return job_series.job_series(s, job_id)
        except repo.UnknownJob as e:
            raise not_found(str(e)) from e


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> HTMLResponse:
    series = _series(request, job_id)
    return templates.TemplateResponse(request, "job.html", {"series": series, "job_id": job_id})


@router.get("/dashboard/jobs/{job_id}")
def job_json(request: Request, job_id: str) -> dict[str, Any]:
    return _series(request, job_id)
