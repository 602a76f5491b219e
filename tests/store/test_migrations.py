"""`applespec db upgrade` on empty SQLite and PostgreSQL databases."""

import pytest
from alembic import command
from click.testing import CliRunner
from sqlalchemy import create_engine, inspect, text

from api.cli import cli
from core.store.models import Base
from migrations import alembic_config, head_revision

TABLES = {
    "jobs",
    "items",
    "results",
    "metrics",
    "workers",
    "api_keys",
    "files",
    "batches",
    "alembic_version",
}


def _check_schema(url):
    engine = create_engine(url)
    with engine.connect() as conn:
        insp = inspect(conn)
        assert TABLES <= set(insp.get_table_names())
        for table in Base.metadata.sorted_tables:
            have = {c["name"] for c in insp.get_columns(table.name)}
            assert have == {c.name for c in table.columns}, table.name
        assert {u["name"] for u in insp.get_unique_constraints("results")} == {"uq_results_item_id"}
        assert head_revision() == "0005"
        version = conn.execute(text("select version_num from alembic_version")).scalar()
        assert version == head_revision()
    engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_db_upgrade_on_an_empty_database(backend, request, monkeypatch):
    url = request.getfixturevalue(f"{'sqlite' if backend == 'sqlite' else 'postgres'}_url")
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", url)
    runner = CliRunner()
    first = runner.invoke(cli, ["db", "upgrade"])
    assert first.exit_code == 0, first.output
    assert "database at head" in first.output
    _check_schema(url)
    again = runner.invoke(cli, ["db", "upgrade"])  # idempotent
    assert again.exit_code == 0, again.output
    down = runner.invoke(cli, ["db", "upgrade", "--revision", "0001"])
    assert down.exit_code == 0, down.output  # already past it: a no-op
    command.downgrade(alembic_config(url), "0001")  # 0002 comes off cleanly
    command.upgrade(alembic_config(url), "head")
    _check_schema(url)


def test_db_upgrade_with_an_unreachable_database_is_one_line(monkeypatch):
    monkeypatch.setenv("APPLESPEC_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:1/none")
    result = CliRunner().invoke(cli, ["db", "upgrade"])
    assert result.exit_code == 1
    assert result.output.startswith("Error: cannot migrate the database")
    assert "Traceback" not in result.output
