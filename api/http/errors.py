"""OpenAI's error body for every failure: `{"error": {"message", "type", "param", "code"}}`.

Clients written against the OpenAI API (the `openai` package first) read these fields; a
bad request is answered with the 4xx that names it and a message that says what to fix,
never with a traceback.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)


class OpenAIError(Exception):
    """An API error with OpenAI's fields; raise it from a route."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",  # noqa: A002 - OpenAI's field name
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )

    def response(self) -> JSONResponse:
        return error_response(self.status, self.message, self.type, self.param, self.code)


def error_response(
    status: int,
    message: str,
    type: str = "invalid_request_error",  # noqa: A002
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": type, "param": param, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def not_found(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, message, param=param, code="not_found")


def install(app: FastAPI) -> None:
    """Answer every error of `app` with OpenAI's body."""

    @app.exception_handler(OpenAIError)
    async def _openai(_request: Request, e: OpenAIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p not in ("body", "query", "path")]
        where = ".".join(loc) or "request"
        message = f"{where}: {first.get('msg', 'invalid value')}"
        if first.get("type") == "json_invalid":
            message = "the request body is not valid JSON"
        return error_response(400, message, param=loc[-1] if loc else None, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        messages = {404: "no such route", 405: "method not allowed for this route"}
        return error_response(
            e.status_code,
            messages.get(e.status_code, str(e.detail)),
            headers=getattr(e, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> JSONResponse:
        log.exception("error serving %s %s", request.method, request.url.path)
        return error_response(
            500,
            f"the server had an error processing the request ({type(e).__name__})",
            type="server_error",
        )
