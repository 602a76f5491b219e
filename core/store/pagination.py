"""Cursor pages, newest first, as the OpenAI list endpoints return them (`limit`, `after`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import Session


class UnknownCursor(LookupError):
    """`after` names no object of this list."""


def newest_first(
    session: Session, stmt: Select, model: Any, *, limit: int, after: str | None, id_column=None
) -> tuple[list[Any], bool]:
    """One page of `stmt` (already filtered to what the caller may see), newest first.

    Args:
        stmt: a select of `model` rows.
        model: the mapped class; it has `created_at` and its id in `id_column` (default `id`).
        limit: rows per page.
        after: the id of the last row of the previous page, or None for the first page.

    Returns:
        The rows and whether more follow.

    Raises:
        UnknownCursor: `after` is not a row of `stmt`.
    """
    id_col = model.id if id_column is None else id_column
    if after is not None:
        anchor = session.execute(stmt.where(id_col == after)).scalars().first()
        if anchor is None:
            raise UnknownCursor(f"no object {after!r} to list after")
        created = anchor.created_at
        stmt = stmt.where(
            or_(model.created_at < created, and_(model.created_at == created, id_col < after))
        )
    rows = list(
        session.execute(stmt.order_by(model.created_at.desc(), id_col.desc()).limit(limit + 1))
        .scalars()
        .all()
    )
    return rows[:limit], len(rows) > limit
