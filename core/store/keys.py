"""API keys for the HTTP API: random bearer tokens, stored only as their SHA-256 digests.

A token carries 256 random bits, so a fast digest is as safe as a slow password hash (there
is nothing to guess) and can be looked up by index on every request. The token itself is
shown once, when the key is created.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from datetime import datetime

from sqlalchemy import String, select
from sqlalchemy.orm import Mapped, Session, mapped_column

from .models import Base, utcnow

TOKEN_PREFIX = "as-"


class UnknownKey(LookupError):
    """No API key with this id."""


class ApiKey(Base):
    """One bearer token of the HTTP API; its files and batches belong to it."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    digest: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex of the token
    hint: Mapped[str] = mapped_column(String(16))  # the token's first characters, for `keys list`
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None]


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_key(session: Session, name: str) -> tuple[ApiKey, str]:
    """Store a new key; returns it and its token (the only time the token is known). Commits."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=f"key_{uuid.uuid4().hex[:16]}",
        name=name,
        digest=digest(token),
        hint=token[: len(TOKEN_PREFIX) + 4],
        created_at=utcnow(),
    )
    session.add(key)
    session.commit()
    return key, token


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)))


def revoke_key(session: Session, key_id: str) -> ApiKey:
    """Revoke a key (idempotent): its token stops working at once; its objects stay. Commits."""
    key = session.get(ApiKey, key_id)
    if key is None:
        raise UnknownKey(f"no API key {key_id!r}")
    if key.revoked_at is None:
        key.revoked_at = utcnow()
    session.commit()
    return key


def key_for_token(session: Session, token: str) -> ApiKey | None:
    """The active key whose token this is, or None."""
    return session.scalars(
        select(ApiKey).where(ApiKey.digest == digest(token), ApiKey.revoked_at.is_(None))
    ).first()


def keys_in_use(session: Session) -> bool:
    """Whether any key was ever made: from then on every API request needs an active one
    (revoking the last key does not open the API again)."""
    return session.scalar(select(ApiKey.id).limit(1)) is not None


def active_keys(session: Session) -> int:
    return len(session.scalars(select(ApiKey.id).where(ApiKey.revoked_at.is_(None))).all())
