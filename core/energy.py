"""Energy as the platform reports it: NVML on NVIDIA GPUs, RAPL on Linux, else nothing.

A `Meter` reads a cumulative energy counter in joules: the NVIDIA driver's total energy of
every GPU (`nvmlDeviceGetTotalEnergyConsumption`, through the `nvidia-ml-py` package,
imported only when it is installed) or the CPU packages' RAPL counters under
/sys/class/powercap (often readable by root only). Where neither can be read there is no
meter and every figure is None ("not measured"), never an estimate. On macOS,
`powermetrics` reports CPU/GPU power but needs root and is not read here (README).

An `EnergyClock` splits one process's readings between the requests it finishes: each
finish takes the energy used since the previous one (or since the process went from idle
to busy). A request's figure is therefore its share of what the device used while it and
its batch-mates ran; the sum over a job is what the device used during the job. Processes
that share one device each see the whole device.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

POWERCAP = Path("/sys/class/powercap")
# Where the RAPL zones are read (another sysfs mount, or a test's fake tree).
POWERCAP_ENV = "APPLESPEC_POWERCAP"


class Meter(Protocol):
    source: str  # "nvml" | "rapl"

    def joules(self) -> float | None:
        """The counter now (joules since some fixed point), or None if it cannot be read."""


class NvmlMeter:
    """Every NVIDIA GPU's total energy counter (millijoules since the driver loaded)."""

    source = "nvml"

    def __init__(self, nvml):
        self.nvml = nvml
        nvml.nvmlInit()
        count = nvml.nvmlDeviceGetCount()
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        if not self.handles or self.joules() is None:
            raise RuntimeError("no GPU reports its energy through NVML")

    def joules(self) -> float | None:
        try:
            return sum(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in self.handles) / 1e3
        except self.nvml.NVMLError:
            return None


class RaplMeter:
    """The CPU packages' RAPL counters (`intel-rapl:N/energy_uj`), wrap-around handled."""

    source = "rapl"

    def __init__(self, root: Path = POWERCAP):
        self.zones = sorted(
            z for z in root.glob("intel-rapl:*") if z.name.count(":") == 1
        )  # packages only: their subzones (core, uncore, dram) are inside them
        self._last: dict[Path, int] = {}
        self._total = 0.0
        self._lock = threading.Lock()
        if not self.zones or self.joules() is None:
            raise RuntimeError("no readable RAPL package counter")

    def joules(self) -> float | None:
        with self._lock:
            try:
                now = {z: int((z / "energy_uj").read_text()) for z in self.zones}
            except (OSError, ValueError):
                return None
            for z, uj in now.items():
                last = self._last.get(z)
                if last is not None:
                    step = uj - last
                    if step < 0:  # the counter wrapped
                        step += int((z / "max_energy_range_uj").read_text())
                    self._total += step / 1e6
                self._last[z] = uj
            return self._total


def _nvml_module():
    try:
        import pynvml  # the `nvidia-ml-py` package
    except ImportError:
        return None
    return pynvml


def find_meter(
    nvml: Callable[[], object | None] = _nvml_module, powercap: Path | None = None
) -> Meter | None:
    """The first meter this machine can read: NVML, then RAPL; None when neither."""
    powercap = powercap or Path(os.environ.get(POWERCAP_ENV) or POWERCAP)
    module = nvml()
    if module is not None:
        try:
            return NvmlMeter(module)
        except Exception:  # no driver, no GPU, or a GPU without an energy counter
            pass
    try:
        return RaplMeter(powercap)
    except Exception:
        return None


class EnergyClock:
    """Splits a meter's readings between the requests a process finishes (module docstring)."""

    def __init__(self, meter: Meter | None):
        self.meter = meter
        self.source = meter.source if meter is not None else None
        self._last: float | None = None
        self._lock = threading.Lock()

    def mark(self) -> None:
        """Start counting from now (the process goes from idle to busy)."""
        if self.meter is not None:
            with self._lock:
                self._last = self.meter.joules()

    def split(self) -> float | None:
        """Joules used since the previous split (or mark); None when not measured."""
        if self.meter is None:
            return None
        with self._lock:
            now = self.meter.joules()
            last, self._last = self._last, now
        if now is None or last is None:
            return None
        return max(now - last, 0.0)
