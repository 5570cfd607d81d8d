"""The GPU busy sampler (kernellab._busy) and the pace a bench page records (kernellab.bench)."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from kernellab._busy import BusySampler
from kernellab.bench import _md_pace, pace_line


def test_without_nvml_every_field_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with BusySampler(interval_s=0.05) as s:
        time.sleep(0.2)
    out = s.summary()
    assert out["samples"] == 0 and out["mean_util"] is None and out["busy_share"] is None
    assert out["error"].startswith("NVML unavailable")


def test_no_devices_samples_nothing() -> None:
    with BusySampler(devices=[]) as s:
        pass
    assert s.summary()["busy_share"] is None and s.summary()["error"] == "no GPU to sample"


class _NVMLError(Exception):
    pass


def _fake_nvml(values: list[float | None]) -> types.ModuleType:
    """nvidia-ml-py's calls that the sampler makes; a None among ``values`` is a read that fails (as NVML
    raises on a MIG slice). The values repeat their last one once used up."""
    m = types.ModuleType("pynvml")
    lock = threading.Lock()
    left = list(values)
    m.shut = False

    def util(h: object) -> types.SimpleNamespace:
        with lock:
            v = left.pop(0) if len(left) > 1 else left[0]
        if v is None:
            raise _NVMLError("Not Supported")
        return types.SimpleNamespace(gpu=v, memory=0)

    m.nvmlInit = lambda: None
    m.nvmlDeviceGetCount = lambda: 1
    m.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    m.nvmlDeviceGetUtilizationRates = util
    m.nvmlShutdown = lambda: setattr(m, "shut", True)
    return m


def test_mean_and_busy_share_over_samples_failures_counted_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml([0, 50, None, 100, 0])  # then 0 for good
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    s = BusySampler(interval_s=0.01)
    with s:
        deadline = time.monotonic() + 5
        while s.summary()["samples"] < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
    out = s.summary()
    n = out["samples"]
    assert n >= 8 and out["failures"] == 1 and out["devices"] == ["0"]
    assert out["mean_util"] == pytest.approx(150 / n, abs=0.01)
    # the share of the time a kernel ran (NVML's utilization, averaged), not the share of samples above 0
    assert out["busy_share"] == pytest.approx(1.5 / n, abs=1e-4)
    assert out["samples_above_0"] == pytest.approx(2 / n, abs=1e-4)
    assert fake.shut  # NVML is shut down on exit


def test_pace_line_and_page_say_nothing_of_the_gpu_without_samples() -> None:
    pace = {"wall_s": 360.0, "problems_done": 3, "problems_per_hour": 30.0, "evaluations": 40,
            "evaluations_per_hour": 400.0, "gpus": 0, "gpu_hours": None, "evaluations_per_gpu_hour": None,
            "gpu_busy_share": None, "gpu_util_mean": None, "gpu_samples": 0, "gpu_sampler": "no GPU to sample"}
    line = pace_line(pace)
    assert line == "bench: pace: 3 problems in 360 s (30.0 problems/hour), 40 evaluations (400 per hour)"
    md = "\n".join(_md_pace({"pace": pace}))
    assert "| 360.0 | 3 | 30.0 | 40 | - | 0 | - | - |" in md
    gpu = {**pace, "gpus": 1, "gpu_hours": 0.1, "evaluations_per_gpu_hour": 400.0, "gpu_busy_share": 0.41,
           "gpu_util_mean": 41.0}
    assert pace_line(gpu).endswith("40 evaluations (400 per GPU-hour), GPU busy 41% of the time (NVML utilization)")
