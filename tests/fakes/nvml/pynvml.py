"""A fake `pynvml` (the `nvidia-ml-py` module) for tests: put this directory on PYTHONPATH.

Two GPUs. Every reading of a GPU's total energy counter moves it on by FAKE_NVML_STEP_MJ
millijoules (1000 by default), so each reading of both (a meter's `joules()`) is 4 J past
the one before, whatever the time: tests check the arithmetic, not the clock.
"""

import itertools
import os

_calls = itertools.count(1)


class NVMLError(Exception):
    pass


def nvmlInit():
    if os.environ.get("FAKE_NVML_DRIVER") == "missing":
        raise NVMLError("Driver Not Loaded")


def nvmlDeviceGetCount():
    return 2


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetTotalEnergyConsumption(handle):
    return next(_calls) * int(os.environ.get("FAKE_NVML_STEP_MJ", "1000"))
