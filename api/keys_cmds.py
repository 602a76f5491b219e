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
@click.option(
    "--operator",
    is_flag=True,
    help="The farm's operator: sees every key's jobs on the dashboard, and owns the files "
    "and batches made before the first key.",
)
def create_cmd(name: str, operator: bool) -> None:
    """Make a key; the key itself is printed once, as the last line, and never stored.

    A key sees its own files and batches, over the API and on the dashboard (sign in there
    with the key once). An operator key sees the whole farm on the dashboard.

    \b
    Examples:
        KEY="$(applespec keys create labeling-pipeline | tail -1)"
        applespec keys create --operator ops
    """
    from core.store import keys

    if not name.strip():
        raise click.ClickException("a key needs a non-empty NAME")
    with _sessions()() as s:
        before = keys.unowned(s)
        key, token = keys.create_key(s, name.strip(), operator=operator)
    kind = "operator key" if operator else "key"
    click.echo(f"{key.id} ({key.name}): {kind}, shown once, keep it now", err=True)
    if operator and before:
        click.echo(f"it owns the {before} files and batches made before keys", err=True)
    if before and not operator:
        left = before
        click.echo(
            f"note: {left} files and batches made before keys belong to the operator: "
            "make one with `applespec keys create --operator NAME`",
            err=True,
        )
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
                "operator": k.operator,
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
        name = f"{r['name']} (operator)" if r["operator"] else r["name"]
        click.echo(f"{r['id']}  {r['hint']:<10} {r['created_at'][:19]}  {state:<28} {name}")


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
