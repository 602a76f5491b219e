"""`applespec keys create|list|revoke`: the HTTP API's bearer keys (stored hashed)."""

from __future__ import annotations

import json

import click

from core.settings import Settings


def _sessions():
    from api.openers import open_store

    return open_store(Settings.from_env())


@click.group("keys")
def keys_group() -> None:
    """API keys for `applespec serve` (Authorization: Bearer KEY)."""


@keys_group.command("create")
@click.argument("name")
def create_cmd(name: str) -> None:
    """Make a key; the key itself is printed once, as the last line, and never stored.

    \b
    Example:
        KEY="$(applespec keys create labeling-pipeline | tail -1)"
    """
    from core.store import keys

    if not name.strip():
        raise click.ClickException("a key needs a non-empty NAME")
    with _sessions()() as s:
        key, token = keys.create_key(s, name.strip())
    click.echo(f"{key.id} ({key.name}): shown once, keep it now", err=True)
    click.echo(token)


@keys_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
def list_cmd(as_json: bool) -> None:
    """List keys: id, name, the key's first characters, created, revoked."""
    from core.store import keys
    from core.store.repo import aware

    with _sessions()() as s:
        rows = [
            {
                "id": k.id,
                "name": k.name,
                "hint": k.hint + "…",
                "created_at": aware(k.created_at).isoformat(),
                "revoked_at": aware(k.revoked_at).isoformat() if k.revoked_at else None,
            }
            for k in keys.list_keys(s)
        ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no keys (the API is open on loopback only)", err=True)
    for r in rows:
        state = f"revoked {r['revoked_at'][:19]}" if r["revoked_at"] else "active"
        click.echo(f"{r['id']}  {r['hint']:<10} {r['created_at'][:19]}  {state:<28} {r['name']}")


@keys_group.command("revoke")
@click.argument("key_id")
def revoke_cmd(key_id: str) -> None:
    """Revoke a key by id (see `keys list`); it stops working at once."""
    from core.store import keys

    with _sessions()() as s:
        try:
            key = keys.revoke_key(s, key_id)
        except keys.UnknownKey as e:
            raise click.ClickException(str(e)) from e
    click.echo(f"{key.id} ({key.name}): revoked")
