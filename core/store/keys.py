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

from sqlalchemy import String, false, func, select, update
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
    # An operator key sees the whole farm on the dashboard, and owns what was made before
    # keys were in use.
    operator: Mapped[bool] = mapped_column(default=False, server_default=false())


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_key(session: Session, name: str, operator: bool = False) -> tuple[ApiKey, str]:
    """Store a new key; returns it and its token (the only time the token is known). Commits.

    An operator key takes the files and batches made while no key existed (they belonged to
    nobody, so no key could reach them once keys were in use).
    """
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        id=f"key_{uuid.uuid4().hex[:16]}",
        name=name,
        digest=digest(token),
        hint=token[: len(TOKEN_PREFIX) + 4],
        created_at=utcnow(),
        operator=operator,
    )
    session.add(key)
    session.flush()
    if operator:
        claim_unowned(session, key.id)
    session.commit()
    return key, token


# The tables whose rows belong to a key (key_id), by name: this module imports none of them.
OWNED_TABLES = ("files", "batches")


def claim_unowned(session: Session, key_id: str) -> int:
    """Give the rows that belong to nobody (made before the first key) to `key_id`; how many."""
    claimed = 0
    for name in OWNED_TABLES:
        table = Base.metadata.tables[name]
        claimed += session.execute(
            update(table).where(table.c.key_id.is_(None)).values(key_id=key_id)
        ).rowcount
    return claimed


def unowned(session: Session) -> int:
    """How many files and batches belong to nobody (made before the first key)."""
    tables = [Base.metadata.tables[name] for name in OWNED_TABLES]
    return sum(
        session.scalar(select(func.count()).select_from(t).where(t.c.key_id.is_(None)))
        for t in tables
    )


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
