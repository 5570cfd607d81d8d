"""How busy the GPUs were while a command ran: NVML's utilization, sampled by a background thread.

``nvmlDeviceGetUtilizationRates(h).gpu`` is the percentage of the last sample period (1/6 s to 1 s, by
device) during which a kernel ran; we read it every ``interval_s`` on each device the command uses. The
summary gives the mean utilization, the *busy share* (that mean as a fraction: the share of the time a
kernel ran, NVML's own definition) and the fraction of samples above 0 (``samples_above_0``, a looser
number: a sample with one short kernel counts; issue 30's evidence had 40% of them at 0%). Without NVML (no ``nvidia-ml-py``, no driver, a CPU
host) every field is None and nothing is said about the GPU; a failing read is counted, never raised.

Where the idle time is: with a ``probe`` (a bench's executor: ``LocalExecutor.gpu_state``) each sample is filed
under what the GPU was held for when it was read (``held``: alone, drain, shared, none) with how many of the
executor's threads were in each phase or wait (``doing``), so the summary says how much of the time the GPU sat
in each state and how busy it was there. Each sample also reads the host's CPU (``/proc/stat``, Linux) and this
process's CPU seconds: a pool that waits on the host (its compiles, one interpreter's lock) shows there.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any


class BusySampler:
    """``with BusySampler() as s: ...; s.summary()``. ``devices``: ids as CUDA_VISIBLE_DEVICES names them
    (indices or UUIDs); None = CUDA_VISIBLE_DEVICES where set, else every device NVML sees; ``[]`` = none
    (a CPU or remote run: nothing sampled). NVML numbers devices in PCI order, as CUDA does under
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; on a one-GPU host the orders agree."""

    def __init__(self, devices: Sequence[str | int] | None = None, interval_s: float = 0.5,
                 probe: Callable[[], dict] | None = None):
        self.devices = None if devices is None else [str(d).strip() for d in devices if str(d).strip()]
        self.interval_s = interval_s
        self.probe = probe
        self.tally = StateTally()
        self._cpu = _Cpu()
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
        self._cpu.start()
        if self.devices == []:
            self.error = "no GPU to sample"
            self._start_thread()  # the host's CPU and the probe's states, where there is a probe
            return
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as exc:  # no package, no driver, no permission: the summary says NVML is missing
            self.error = f"NVML unavailable: {type(exc).__name__}: {exc}"[:300]
            self._start_thread()
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
            self._start_thread()
            return
        if not self._handles:
            self.error = "no GPU to sample"
            self._close()
        self._start_thread()

    def _start_thread(self) -> None:
        if not self._handles and self.probe is None:
            return  # nothing of the GPU to say: the host's CPU is not read on its own
        self._sample()  # one at the start: a short command still has a sample
        self._thread = threading.Thread(target=self._loop, name="kernellab-busy-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def _sample(self) -> None:
        utils: list[float | None] = []
        for h in self._handles:
            try:
                u = float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:  # a read that fails (MIG, a device gone) is not a sample of 0
                with self._lock:
                    self._failures += 1
                utils.append(None)
                continue
            utils.append(u)
            with self._lock:
                self._n += 1
                self._sum += u
                self._busy += u > 0
        state = None
        if self.probe is not None:
            try:
                state = self.probe()
            except Exception:  # a probe that fails is a diagnostic lost, never the command's failure
                state = None
        with self._lock:
            self._cpu.sample()
            if state is not None:
                self.tally.add(utils, state)

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
        ``failures`` (reads that failed), ``devices``, ``error`` (why there are none). None without samples.
        ``host_cpu_busy`` (0..1, the host's CPUs over the samples; None off Linux), ``process_cpus`` (CPUs
        this process used on average), and where a probe said ``states`` (:meth:`StateTally.summary`)."""
        with self._lock:
            n, total, busy, failures = self._n, self._sum, self._busy, self._failures
            cpu = self._cpu.summary()
            states = self.tally.summary() if self.tally.n else None  # None: no probe, or one that could not say
        return {"samples": n, "mean_util": round(total / n, 2) if n else None,
                "busy_share": round(total / n / 100, 4) if n else None,
                "samples_above_0": round(busy / n, 4) if n else None, "failures": failures,
                "devices": list(self._names), "interval_s": self.interval_s, "error": self.error,
                **cpu, "states": states}


class StateTally:
    """Samples filed by what the GPU was held for: per ``held`` label (one per GPU, the probe's order, paired
    with the devices' reads in order -- on a one-GPU host the orders agree), how many samples, their
    utilization, and the mean count of the executor's threads in each phase or wait (``doing``)."""

    def __init__(self) -> None:
        self.n = 0
        self.by: dict[str, list[float]] = {}  # label -> [samples, util sum, util reads]
        self.doing: dict[str, dict[str, float]] = {}  # label -> phase -> summed count
        self.queued = 0.0

    def add(self, utils: list[float | None], state: dict) -> None:
        held = list(state.get("held") or ["none"])
        doing = state.get("doing") or {}
        self.n += 1
        self.queued += float(state.get("queued") or 0)
        for i, label in enumerate(held):
            row = self.by.setdefault(label, [0.0, 0.0, 0.0])
            row[0] += 1
            u = utils[i] if i < len(utils) else None
            if u is not None:
                row[1] += u
                row[2] += 1
            into = self.doing.setdefault(label, {})
            for phase, k in doing.items():  # a pool's threads serve all its GPUs: counted with each
                into[phase] = into.get(phase, 0.0) + k

    def summary(self) -> dict:
        """``{"samples", "queued_mean", "held": {label: {"share", "util", "doing": {phase: mean count}}}}``:
        ``share`` of the GPU-samples in that state, ``util`` the mean utilization there (percent; None without
        NVML), ``doing`` the mean number of threads in each phase while in it."""
        total = sum(r[0] for r in self.by.values())
        held = {}
        for label, (k, usum, un) in sorted(self.by.items(), key=lambda kv: -kv[1][0]):
            held[label] = {"share": round(k / total, 4) if total else None,
                           "util": round(usum / un, 2) if un else None,
                           "doing": {p: round(c / k, 2) for p, c in sorted(self.doing.get(label, {}).items(),
                                                                             key=lambda kv: -kv[1]) if c}}
        return {"samples": self.n, "queued_mean": round(self.queued / self.n, 2) if self.n else None, "held": held}


class _Cpu:
    """The host's CPU busy share between the first and the last sample (``/proc/stat``'s first line: busy is
    everything but idle and iowait) and this process's CPU seconds over the same wall time."""

    def __init__(self) -> None:
        self.t0 = self.p0 = self.t = self.p = None
        self.s0 = self.s = None

    def start(self) -> None:
        self.t0, self.p0, self.s0 = time.monotonic(), _process_cpu(), _host_stat()
        self.t, self.p, self.s = self.t0, self.p0, self.s0

    def sample(self) -> None:
        if self.t0 is None:
            self.start()
        self.t, self.p, self.s = time.monotonic(), _process_cpu(), _host_stat()

    def summary(self) -> dict:
        wall = (self.t - self.t0) if self.t0 is not None else 0.0
        host = None
        if self.s0 is not None and self.s is not None:
            busy, total = self.s[0] - self.s0[0], self.s[1] - self.s0[1]
            host = round(busy / total, 4) if total > 0 else None
        return {"host_cpu_busy": host, "process_cpus": round((self.p - self.p0) / wall, 2) if wall > 0 else None}


def _process_cpu() -> float:
    t = os.times()
    return t.user + t.system


def _host_stat() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, or None where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
        v = [int(x) for x in parts[1:]]
    except (OSError, ValueError):
        return None
    if len(v) < 4:
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    total = sum(v[:8])  # guest time is counted in user already
    return total - idle, total


def _visible() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's ids, or None where it is not set (every device)."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None:
        return None
    return [v.strip() for v in vis.split(",") if v.strip()]


__all__ = ["BusySampler", "StateTally"]
