"""The dashboard: `/` (jobs, workers, queues) and `/jobs/{id}` (one job's figures).

Pages are rendered by Jinja2 with the data they show, then poll the JSON routes below
(`/dashboard/state`, `/dashboard/jobs/{id}`) and update in place: progress bars and charts
move without a reload. Chart.js is served from this package (no CDN).

The dashboard shows job ids, counts, ETA and speculation metrics, never a prompt or an
output. Once any API key exists it needs one (api.http.signin): a key sees its own batches,
an operator key the whole farm (every job, the workers, the queues); with no key made it is
open on loopback and shows the whole farm.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, Response
from fastapi.templating import Jinja2Templates

from core.store import batches, job_series, repo
from core.store.repo import duration

from . import signin
from .errors import not_found
from .signin import Viewer, json_viewer

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters["duration"] = duration
router = APIRouter()
JsonViewer = Annotated[Viewer, Depends(json_viewer)]
signin_router = signin.install(templates)


def farm_state(request: Request, viewer: Viewer, limit: int = 50) -> dict[str, Any]:
    """Jobs, workers online and queue depth per model: what `/` shows. A key that is not
    the operator's sees its own batches only, and no workers or queues."""
    state = request.app.state
    with state.reader() as s:
        jobs = job_series.jobs_overview(
            s, limit, key_id=None if viewer.whole_farm else viewer.key_id
        )
        if not viewer.whole_farm:
            return {
                "jobs": jobs,
                "workers": [],
                "workers_checked_at": None,
                "broker_error": None,
                "queues": [],
                "scope": "key",
            }
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
        "scope": "farm",
    }


@router.get("/", response_class=HTMLResponse)
def index(request: Request) -> Response:
    viewer = signin.viewer(request)
    if viewer is None:
        return signin.to_signin(request)
    context = {"state": farm_state(request, viewer), "viewer": viewer}
    return templates.TemplateResponse(request, "index.html", context)


@router.get("/dashboard/state")
def state_json(request: Request, viewer: JsonViewer) -> dict[str, Any]:
    return farm_state(request, viewer)


def _series(request: Request, job_id: str, viewer: Viewer) -> dict[str, Any]:
    with request.app.state.reader() as s:
        if not viewer.whole_farm:
            try:  # another key's job, or one submitted from the CLI, is as unknown as none
                batches.get_batch(s, job_id, viewer.key_id)
            except batches.UnknownBatch as e:
                raise not_found(f"no job {job_id!r}") from e
        try:
            return job_series.job_series(s, job_id)
        except repo.UnknownJob as e:
            raise not_found(str(e)) from e


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, job_id: str) -> Response:
    viewer = signin.viewer(request)
    if viewer is None:
        return signin.to_signin(request)
    series = _series(request, job_id, viewer)
    context = {"series": series, "job_id": job_id, "viewer": viewer}
    return templates.TemplateResponse(request, "job.html", context)


@router.get("/dashboard/jobs/{job_id}")
def job_json(request: Request, job_id: str, viewer: JsonViewer) -> dict[str, Any]:
    return _series(request, job_id, viewer)
