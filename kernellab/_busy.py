"""How busy the GPUs were while a command ran: NVML's utilization, sampled by a background thread.

``nvmlDeviceGetUtilizationRates(h).gpu`` is the percentage of the last sample period (1/6 s to 1 s, by
device) during which a kernel ran; we read it every ``interval_s`` on each device the command uses. The
summary gives the mean utilization, the *busy share* (that mean as a fraction: the share of the time a
kernel ran, NVML's own definition) and the fraction of samples above 0 (``samples_above_0``, a looser
number: a sample with one short kernel counts; issue 30's evidence had 40% of them at 0%). Without NVML (no ``nvidia-ml-py``, no driver, a CPU
host) every field is None and nothing is said about the GPU; a failing read is counted, never raised.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any


class BusySampler:
    """``with BusySampler() as s: ...; s.summary()``. ``devices``: ids as CUDA_VISIBLE_DEVICES names them
    (indices or UUIDs); None = CUDA_VISIBLE_DEVICES where set, else every device NVML sees; ``[]`` = none
    (a CPU or remote run: nothing sampled). NVML numbers devices in PCI order, as CUDA does under
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a one-GPU host the orders agree."""

    def __init__(self, devices: Sequence[str | int] | None = None, interval_s: float = 0.5):
        self.devices = None if devices is None else [str(d).strip() for d in devices if str(d).strip()]
        self.interval_s = interval_s
        self.error: str | None = None
        self._nvml: Any = None
        self._handles: list[Any] = []
        self._names: list[str] = []
        self._lock = threading.Lock()
        self._n = self._busy = self._failures = 0
        self._sum = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> BusySampler:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def start(self) -> None:
        if self.devices == []:
            self.error = "no GPU to sample"
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no package, no driver, no permission: the summary says NVML is missing
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"[:300]
            return
        self._nvml = pynvml
        try:
            ids = self.devices if self.devices is not None else _visible()
            if ids is None:
                ids = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
            for d in ids:
                h = (pynvml.nvmlDeviceGetHandleByIndex(int(d)) if d.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(d))
                self._handles.append(h)
                self._names.append(d)
        except Exception as exc:
            self.error = f"NVML: cannot open device: {type(exc).__name__}: {exc}"[:300]
            self._close()
            return
        if not self._handles:
            self.error = "no GPU to sample"
            self._close()
            return
        self._sample()  # one at the start: a short command still has a sample
        self._thread = threading.Thread(target=self._loop, name="kernellab-busy-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        for h in self._handles:
            try:
                u = float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:  # a read that fails (MIG, a device gone) is not a sample of 0
                with self._lock:
                    self._failures += 1
                continue
            with self._lock:
                self._n += 1
                self._sum += u
                self._busy += u > 0

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._close()

    def _close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None

    def summary(self) -> dict:
        """``samples`` (device reads), ``mean_util`` (percent), ``busy_share`` (0..1: ``mean_util`` / 100),
        ``samples_above_0`` (0..1),
        ``failures`` (reads that failed), ``devices``, ``error`` (why there are none). None without samples."""
        with self._lock:
            n, total, busy, failures = self._n, self._sum, self._busy, self._failures
        return {"samples": n, "mean_util": round(total / n, 2) if n else None,
                "busy_share": round(total / n / 100, 4) if n else None,
                "samples_above_0": round(busy / n, 4) if n else None, "failures": failures,
                "devices": list(self._names), "interval_s": self.interval_s, "error": self.error}


def _visible() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's ids, or None where it is not set (every device)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return None
    return [v.strip() for v in vis.split(",") if v.strip()]


__all__ = ["BusySampler"]
