"""`applespec report` on hand-made rows: one figure per series, the batch size when reported."""

from __future__ import annotations

import base64
import io
import re

from click.testing import CliRunner
from PIL import Image

from api.cli import cli
from core.store.database import make_engine, make_sessionmaker
from migrations import upgrade
from tests.store.test_job_series import _finish, _job


def _pngs(page: str) -> list[Image.Image]:
    found = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    return [Image.open(io.BytesIO(base64.b64decode(data))) for data in found]


def test_report_draws_the_batch_size_when_the_engine_reports_it(store, tmp_path):
    upgrade(store)
    engine = make_engine(store)
    with make_sessionmaker(engine)() as s:
        job_id, ids = _job(s, 2)
        _finish(s, ids[0], "a:1", 2, 1, [1], batch_size=8)
        _finish(s, ids[1], "b:1", 2, 2, [1, 1], batch_size=4)
    engine.dispose()
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", job_id, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "6 figures" in result.output
    page = out.read_text()
    images = _pngs(page)
    assert len(images) == 6 and all(i.format == "PNG" for i in images)
    assert "Batch size per item" in page and "mean batch size 6" in page


def test_report_of_an_unknown_job_is_one_line(store, tmp_path):
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", "batch_nope", "-o", str(out)])
    assert result.exit_code == 1
    assert result.output == "Error: no job 'batch_nope'\n"
    assert not out.exists()


def test_report_of_a_job_without_metrics_yet(store, tmp_path):
    upgrade(store)
    engine = make_engine(store)
    with make_sessionmaker(engine)() as s:
        job_id, _ = _job(s, 2)
    engine.dispose()
    out = tmp_path / "r.html"
    result = CliRunner().invoke(cli, ["report", job_id, "-o", str(out)])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert len(_pngs(page)) == 5 and page.count("in_progress") >= 1
