"""Bearer-token authentication: which API key a request acts for.

Until the first key is made (`applespec keys create`), the API on a loopback address is
open and its objects belong to nobody; from then on every request needs an active key,
and `serve` beyond loopback always does (`require_keys`).
"""

from __future__ import annotations

from fastapi import Request

from core.store import keys

from .errors import OpenAIError


def bearer_token(request: Request) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, if any."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def owner(request: Request) -> str | None:
    """The id of the request's API key; None when no keys are in use (a FastAPI dependency).

    Raises:
        OpenAIError: 401 without a key, or with a key that is unknown or revoked.
    """
    state = request.app.state
    token = bearer_token(request)
    with state.reader() as s:
        key = keys.key_for_token(s, token) if token else None
        if key is not None:
            return key.id
        if not state.require_keys and not keys.keys_in_use(s):
            return None
    if token is None:
        raise OpenAIError(
            401,
            "You didn't provide an API key: send `Authorization: Bearer KEY` "
            "(make one with `applespec keys create NAME`).",
            code="missing_api_key",
        )
    shown = token[:6] + "..." if len(token) > 6 else token
    raise OpenAIError(
        401, f"Incorrect API key provided: {shown} (unknown or revoked).", code="invalid_api_key"
    )
