"""The verify-cost surface: interpolation, the batch size it picks, measurement and the copy
kept under APPLESPEC_HOME."""

import json

import mlx.core as mx
import pytest

from core.engine import costs
from core.engine.costs import (
    CostSurface,
    best_ms,
    interleaved_ms,
    load_or_measure,
    machine_key,
    measure_surface,
)

S = CostSurface((1, 4, 16), (1, 2, 4), ((10, 11, 13), (12, 16, 24), (30, 55, 100)))


def test_interpolates_in_rows_and_width_and_extrapolates():
    assert S(1, 1) == 10 and S(4, 8) == 16 and S(16, 64) == 100
    assert S(2, 2) == pytest.approx(11.0)  # halfway between 1 and 4 rows on a log scale
    assert S(1, 1.5) == pytest.approx(10.5)
    assert S(16, 128) == pytest.approx(100 + 45 / 2 * 4)  # past 4 per row: the last slope
    assert S(32, 32) == pytest.approx(60)  # past 16 rows: linear in rows
    assert S.relative(4, 8) == pytest.approx(16 / 12)


def test_best_batch_is_the_smallest_near_the_best_throughput():
    # plain throughput: 1 -> 0.1, 4 -> 0.33, 16 -> 0.53 rows per ms
    assert S.best_batch(64) == 16
    assert S.best_batch(8) == 4
    near = CostSurface((1, 8, 64), (1,), ((10,), (10.2,), (70,)))  # 64 rows: 17% more
    assert near.best_batch(64, within=0.2) == 8 and near.best_batch(64, within=0.1) == 64
    assert CostSurface((1, 8, 64), (1,), ((10,), (11,), (87,))).best_batch(64) == 8


def test_measured_surface_is_positive_and_monotone(make_tiny):
    s = measure_surface(make_tiny(0).model, batches=(1, 4), widths=(1, 2, 4), context=8)
    assert all(m > 0 for row in s.ms for m in row)
    for row in s.ms:
        assert list(row) == sorted(row)
    assert all(a <= b for a, b in zip(s.ms[0], s.ms[1], strict=True))


def test_a_burst_of_load_slows_one_round_not_one_runs_every_timing():
    """Timed in rounds over all runs: a burst as long as one run's warm-up and two timings
    (the calls a run timed alone would make in a row) leaves every run a clean timing."""
    calls = []
    clock = FakeClock()

    def run():
        calls.append(1)
        clock.now += 0.001  # 1 ms a call
        if 4 <= len(calls) <= 6:  # calls 3-5 (0-based): a second run's three, timed alone
            clock.now += 0.05
        return mx.zeros(1)

    ms = interleaved_ms([run, run, run, run], repeats=2, clock=clock)
    assert len(calls) == 4 * 3
    assert ms == pytest.approx([1.0] * 4)
    assert best_ms(run, clock=clock) == pytest.approx(1.0)


class FakeClock:
    """Seconds that pass only when a test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_kept_under_the_data_directory_per_model_shape(make_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    model = make_tiny(0).model
    calls = []

    def fake(m, *a, **kw):
        calls.append(m)
        return S

    monkeypatch.setattr("core.engine.costs.measure_surface", fake)
    assert load_or_measure(model, "a", "float32", rows=16) == S
    assert load_or_measure(make_tiny(1).model, "b", "float32", rows=16) == S  # same shape
    assert len(calls) == 1
    (kept,) = (tmp_path / "costs").iterdir()
    assert json.loads(kept.read_text())["ms"] == [list(r) for r in S.ms]
    other = make_tiny(0, hidden_size=32).model
    assert machine_key(other, "float32") != machine_key(model, "float32")
    assert machine_key(model, "q4") != machine_key(model, "float32")


def test_a_small_job_measures_only_the_batch_sizes_it_can_use(make_tiny, tmp_path, monkeypatch):
    """A job of 3 rows measures batch sizes 1 and 4 only, smallest first, saying so; a later
    job of 10 adds 16 alone; the engine's one-time setup does it before any batch runs."""
    from core.engine import Engine

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    target = make_tiny(0)
    measured, said = [], []
    real = costs.measure_surface

    def spy(model, batches, *a, **kw):
        measured.append(list(batches))
        return real(model, batches, *a, repeats=1, **kw)

    monkeypatch.setattr("core.engine.costs.measure_surface", spy)
    eng = Engine(target, draft="none", max_rows=3, progress=said.append)
    eng.prepare()
    assert measured == [[1, 4]] and eng.surface.batches == (1, 4) and eng.batch_size <= 4
    assert any("batch sizes 1, 4" in s for s in said)
    assert load_or_measure(target.model, "t", "float32", rows=10).batches == (1, 4, 16)
    assert measured == [[1, 4], [16]]
    assert load_or_measure(target.model, "t", "float32", rows=2).batches == (1, 4, 16)
    assert measured == [[1, 4], [16]]  # kept: nothing measured again


def test_an_accelerators_surface_is_kept_under_its_own_name(make_tiny, monkeypatch):
    """Two GPUs on hosts that look alike (macOS reports `arm` for an M1 and an M4; one farm
    may share its data directory) keep a surface each."""
    import mlx.core as mx

    model = make_tiny(0).model
    on_cpu = machine_key(model, "float32")
    monkeypatch.setattr(mx, "default_device", lambda: mx.gpu)
    keys = []
    for name in ("Apple M1", "Apple M4", "Apple M4"):
        monkeypatch.setattr(mx, "device_info", lambda n=name: {"device_name": n})
        keys.append(machine_key(model, "float32"))
    assert keys[0] != keys[1] == keys[2]
    assert on_cpu not in keys


def test_a_damaged_copy_is_measured_again(make_tiny, tmp_path, monkeypatch):
    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    model = make_tiny(0).model
    path = tmp_path / "costs" / f"{machine_key(model, 'float32')}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    monkeypatch.setattr("core.engine.costs.measure_surface", lambda *a, **kw: S)
    assert load_or_measure(model, "a", "float32") == S
    assert json.loads(path.read_text())["batches"] == [1, 4, 16]


def test_costs_command_shows_the_kept_surface_and_measures_it_again(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from api.cli import cli

    monkeypatch.setenv("APPLESPEC_HOME", str(tmp_path))
    calls = []

    def fake(m, *a, **kw):
        calls.append(m)
        return S

    monkeypatch.setattr("core.engine.costs.measure_surface", fake)
    runner = CliRunner()
    res = runner.invoke(cli, ["costs", "--model", "tiny-random:0"])
    assert res.exit_code == 0 and "no surface kept" in res.output and not calls
    res = runner.invoke(cli, ["costs", "--model", "tiny-random:0", "--measure"])
    assert res.exit_code == 0 and len(calls) == 1, res.output
    (kept,) = (tmp_path / "costs").iterdir()
    assert str(kept) in res.output
    rows = [line for line in res.output.splitlines() if line.strip()[:1].isdigit()]
    assert [float(x) for x in rows[0].split(":")[1].split()] == list(S.ms[0])
    res = runner.invoke(cli, ["costs", "--model", "tiny-random:0"])  # shown, not measured
    assert res.exit_code == 0 and len(calls) == 1 and str(kept) in res.output
    res = runner.invoke(cli, ["costs", "--model", "no-such-model"])
    assert res.exit_code == 1 and "Traceback" not in res.output and "Error" in res.output
