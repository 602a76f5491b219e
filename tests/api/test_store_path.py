"""A mistyped SQLite path is an error for every command but `db upgrade`, which creates it.

Before, `submit`, `jobs` and the rest created and migrated a new empty database at any
path they were given, so a typo showed an empty farm instead of an error.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from api.cli import cli

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "job.jsonl"

COMMANDS = [
    ["jobs"],
    ["status", "job-x"],
    ["results", "job-x", "-o", "out.jsonl"],
    ["cancel", "job-x"],
    ["retry", "job-x"],
    ["keys", "list"],
    ["report", "job-x", "-o", "report.html"],
    ["submit", str(EXAMPLE), "--model", "m"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_a_mistyped_sqlite_path_is_an_error(tmp_path, monkeypatch, args):
    typo = tmp_path / "aplespec.db"
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", f"sqlite:///{typo}")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert f"no database at {typo}" in result.output
    assert "applespec db upgrade" in result.output
    assert "Traceback" not in result.output
    assert not typo.exists()


def test_db_upgrade_creates_it_and_then_it_opens(tmp_path, monkeypatch):
    path = tmp_path / "new.db"
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", f"sqlite:///{path}")
    assert CliRunner().invoke(cli, ["db", "upgrade"]).exit_code == 0
    assert path.is_file()
    result = CliRunner().invoke(cli, ["jobs"])
    assert result.exit_code == 0, result.output
