"""`applespec keys create|list|revoke`, and `serve` refusing to listen openly without keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from api.cli import cli
from api.http.app import is_loopback


def run(*args: str):
    return CliRunner().invoke(cli, list(args))


def test_create_prints_the_key_last_and_stores_only_its_digest(store):
    result = run("keys", "create", "labeling pipeline")
    assert result.exit_code == 0, result.output
    token = result.stdout.strip().splitlines()[-1]
    assert token.startswith("as-") and len(token) > 40
    engine = create_engine(store)
    with engine.connect() as conn:
        rows = conn.execute(text("select name, digest, hint from api_keys")).all()
    engine.dispose()
    assert len(rows) == 1 and rows[0].name == "labeling pipeline"
    assert token not in rows[0].digest and len(rows[0].digest) == 64
    assert token.encode() not in Path(store.removeprefix("sqlite:///")).read_bytes()
    listed = json.loads(run("keys", "list", "--json").stdout)
    assert [k["name"] for k in listed] == ["labeling pipeline"]
    assert listed[0]["revoked_at"] is None and token not in json.dumps(listed)
    assert token.startswith(listed[0]["hint"].rstrip("…"))


def test_revoke(store):
    run("keys", "create", "a")
    key_id = json.loads(run("keys", "list", "--json").stdout)[0]["id"]
    result = run("keys", "revoke", key_id)
    assert result.exit_code == 0 and "revoked" in result.output
    assert json.loads(run("keys", "list", "--json").stdout)[0]["revoked_at"] is not None
    assert "revoked" in run("keys", "list").stdout
    again = run("keys", "revoke", key_id)  # idempotent
    assert again.exit_code == 0


def test_revoking_an_unknown_key_is_one_line(store):
    result = run("keys", "revoke", "key_nope")
    assert result.exit_code == 1
    assert result.output == "Error: no API key 'key_nope'\n"


def test_a_key_needs_a_name(store):
    result = run("keys", "create", "  ")
    assert result.exit_code == 1 and "non-empty NAME" in result.output


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::", "farm.local"])
def test_serve_refuses_to_listen_beyond_loopback_without_keys(store, host):
    result = run("serve", "--host", host, "--port", "1")
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: refusing to listen on {host} without API keys")
    assert "Traceback" not in result.output


def test_serve_beyond_loopback_needs_an_active_key(store):
    run("keys", "create", "a")
    key_id = json.loads(run("keys", "list", "--json").stdout)[0]["id"]
    run("keys", "revoke", key_id)
    result = run("serve", "--host", "0.0.0.0", "--port", "1")
    assert result.exit_code == 1 and "without API keys" in result.output


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("host", False),
    ],
)
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_what_was_made_before_keys_goes_to_the_operator_key(store):
    from sqlalchemy import select

    from core.store.batches import Batch
    from tests.http.dashboard_store import Owners

    owners = Owners(store)
    try:
        batch = owners.batch(None)  # made while the API was open
        plain = run("keys", "create", "pipeline")
        assert plain.exit_code == 0, plain.output
        assert "belong to the operator: make one with" in plain.stderr
        ops = run("keys", "create", "--operator", "ops")
        assert ops.exit_code == 0, ops.output
        assert "operator key" in ops.stderr and "owns the 2 files and batches" in ops.stderr
        listed = {
            k["name"]: k["operator"] for k in json.loads(run("keys", "list", "--json").stdout)
        }
        assert listed == {"pipeline": False, "ops": True}
        with owners.sessions() as s:
            owner = s.scalar(select(Batch.key_id).where(Batch.id == batch))
        assert owner == [k["id"] for k in json.loads(run("keys", "list", "--json").stdout)][1]
    finally:
        owners.dispose()
