"""core.energy with fake NVML and RAPL sources, and the real one where this machine has it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from core.energy import EnergyClock, NvmlMeter, RaplMeter, find_meter

FAKES = Path(__file__).parent / "fakes" / "nvml"


@pytest.fixture
def fake_nvml(monkeypatch):
    monkeypatch.syspath_prepend(str(FAKES))
    sys.modules.pop("pynvml", None)
    module = importlib.import_module("pynvml")
    yield module
    sys.modules.pop("pynvml", None)


def rapl_tree(root: Path, packages: dict[int, int], max_uj: int = 1_000_000) -> Path:
    for n, uj in packages.items():
        zone = root / f"intel-rapl:{n}"
        (zone / f"intel-rapl:{n}:0").mkdir(parents=True)
        (zone / "energy_uj").write_text(f"{uj}\n")
        (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
        (zone / f"intel-rapl:{n}:0" / "energy_uj").write_text("999999\n")  # a subzone
    return root


def test_nvml_sums_every_gpu_and_the_clock_splits_it(fake_nvml):
    meter = find_meter(nvml=lambda: fake_nvml, powercap=Path("/nonexistent"))
    assert isinstance(meter, NvmlMeter) and meter.source == "nvml"
    clock = EnergyClock(meter)
    clock.mark()
    assert clock.split() == pytest.approx(4.0)  # two GPUs, each 2 readings of 1000 mJ on
    assert clock.split() == pytest.approx(4.0)


def test_nvml_without_a_driver_falls_back_to_rapl(fake_nvml, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_NVML_DRIVER", "missing")
    meter = find_meter(nvml=lambda: fake_nvml, powercap=rapl_tree(tmp_path, {0: 10}))
    assert isinstance(meter, RaplMeter)


def test_rapl_counts_packages_only_and_handles_the_wrap(tmp_path):
    root = rapl_tree(tmp_path, {0: 900_000, 1: 100})
    meter = find_meter(nvml=lambda: None, powercap=root)
    assert isinstance(meter, RaplMeter) and [z.name for z in meter.zones] == [
        "intel-rapl:0",
        "intel-rapl:1",
    ]
    clock = EnergyClock(meter)
    clock.mark()
    (root / "intel-rapl:0" / "energy_uj").write_text("50000\n")  # wrapped: +150000 uJ
    (root / "intel-rapl:1" / "energy_uj").write_text("2100\n")  # +2000 uJ
    assert clock.split() == pytest.approx(0.152)


def test_nothing_readable_is_not_measured(tmp_path):
    assert find_meter(nvml=lambda: None, powercap=tmp_path / "none") is None
    unreadable = rapl_tree(tmp_path, {0: 5})
    (unreadable / "intel-rapl:0" / "energy_uj").write_text("not a number")
    assert find_meter(nvml=lambda: None, powercap=unreadable) is None
    clock = EnergyClock(None)
    clock.mark()
    assert clock.split() is None and clock.source is None


def test_the_real_meter_where_this_machine_has_one():
    meter = find_meter()
    if meter is None:
        pytest.skip("no NVML GPU and no readable RAPL counter on this machine")
    first = meter.joules()
    assert first is not None and meter.joules() >= first
