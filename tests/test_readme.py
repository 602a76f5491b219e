"""The README says what the code does, on every point issue 50 found it wrong."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from api.cli import cli
from core.jobs import ENGINE_SUPPORTED
from core.settings import default_database_url

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
FORMAT_ONLY = {"model", "messages", "prompt", "user", "metadata", "store", "service_tier"}


def _paragraph(starting: str) -> str:
    start = README.index(starting)
    return README[start : README.index("\n\n", start)]


def test_every_parameter_the_engine_honours_is_listed_as_honoured():
    honoured = _paragraph("The engine honours")
    for name in sorted(ENGINE_SUPPORTED - FORMAT_ONLY):
        assert f"`{name}`" in honoured.split("Every other")[0], name


def test_cancel_help_and_readme_agree_on_running_rows():
    help_text = " ".join(CliRunner().invoke(cli, ["cancel", "--help"]).output.split())
    readme = " ".join(README.split())
    assert "running stop at their worker's next heartbeat" in help_text
    assert "reaches rows already running at their worker's next heartbeat" in readme
    assert "finishes before then keeps its result" in help_text
    assert "finishes before then keeps its result" in readme


def test_draft_help_names_every_drafter():
    help_text = CliRunner().invoke(cli, ["run", "--help"]).output
    flat = " ".join(help_text.split())
    for name in (
        "none",
        "ngram",
        "suffix",
        "tree",
        "early-exit",
        "adapter",
        "head",
        "draft-model",
        "auto",
    ):
        assert re.search(rf"\b{re.escape(name)}\b", flat), name


def test_xdg_data_home_moves_the_database_and_applespec_home_does_not():
    url = default_database_url({"XDG_DATA_HOME": "/data", "APPLESPEC_HOME": "/elsewhere"})
    assert url == "sqlite:////data/applespec/applespec.db"
    flat = " ".join(README.split())
    assert (
        "set `XDG_DATA_HOME` or the URL to move it, `APPLESPEC_HOME` moves the cost surfaces and adapters only"
        in flat
    )


def test_the_per_line_checks_are_said_to_hold_over_http_too():
    flat = " ".join(README.split())
    assert "the same for `run`, `submit` and an upload over HTTP" in flat
