"""Who looks at the dashboard: sign-in with an API key, kept in a cookie.

With no key made (and `serve` on loopback) the dashboard is open and shows the whole farm,
as before keys. Once any key exists, a browser signs in once at `/signin` with a key: the
key goes into an HttpOnly, SameSite=Strict cookie (Secure over HTTPS) and every dashboard
route checks it as the API checks a bearer token (a script may send `Authorization:
Bearer KEY` instead). A key sees its own batches; an operator key (`applespec keys create
--operator NAME`) sees every job, the workers and the queues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from core.store import keys

from .auth import bearer_token
from .errors import OpenAIError

COOKIE = "applespec_key"
COOKIE_AGE_S = 30 * 24 * 3600
router = APIRouter()


@dataclass(frozen=True)
class Viewer:
    """A dashboard reader: `key_id` None for the open dashboard (no keys in use)."""

    key_id: str | None
    operator: bool

    @property
    def whole_farm(self) -> bool:
        return self.key_id is None or self.operator


def viewer(request: Request) -> Viewer | None:
    """The dashboard's reader for this request; None when it must sign in first."""
    state = request.app.state
    token = request.cookies.get(COOKIE) or bearer_token(request)
    with state.reader() as s:
        key = keys.key_for_token(s, token) if token else None
        if key is not None:
            return Viewer(key.id, key.operator)
        if not state.require_keys and not keys.keys_in_use(s):
            return Viewer(None, True)
    return None


def json_viewer(request: Request) -> Viewer:
    """`viewer` for the JSON routes: 401 (OpenAI's error body) instead of a redirect."""
    found = viewer(request)
    if found is None:
        raise OpenAIError(
            401,
            "sign in to the dashboard at /signin with an API key (or send "
            "`Authorization: Bearer KEY`)",
            code="missing_api_key",
        )
    return found


def to_signin(request: Request) -> RedirectResponse:
    """A redirect to the sign-in page that comes back here (a path, not a URL: proxies)."""
    path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    url = request.app.url_path_for("signin_page") + "?" + urlencode({"next": path})
    return RedirectResponse(url, status_code=303)


def _safe_next(target: str | None) -> str:
    """Only a path on this server (`/...`, never `//host` or a URL): no open redirect."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _page(request: Request, templates: Jinja2Templates, status: int, **context: Any):
    return templates.TemplateResponse(request, "signin.html", context, status_code=status)


def install(templates: Jinja2Templates) -> APIRouter:
    """The sign-in routes, rendered with the dashboard's templates."""

    @router.get("/signin", response_class=HTMLResponse, name="signin_page")
    def signin_page(request: Request, next: str = "/") -> Response:  # noqa: A002 - the query
        return _page(request, templates, 200, next=_safe_next(next), error=None)

    @router.post("/signin", response_class=HTMLResponse)
    async def signin(request: Request) -> Response:
        form = await request.form(max_files=0, max_fields=4, max_part_size=4096)
        token = str(form.get("key") or "").strip()
        target = _safe_next(str(form.get("next") or "/"))
        with request.app.state.reader() as s:
            key = keys.key_for_token(s, token) if token else None
        if key is None:
            return _page(request, templates, 401, next=target, error="unknown or revoked key")
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            token,
            max_age=COOKIE_AGE_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @router.post("/signout")
    def signout(request: Request) -> Response:
        response = RedirectResponse(request.app.url_path_for("signin_page"), status_code=303)
        response.delete_cookie(COOKIE)
        return response

    return router
