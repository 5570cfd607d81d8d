"""Timing in the worker: CUDA events with L2 flushes on the GPU, wall clock in the CPU interpreter.

The candidate and the eager reference are timed interleaved (A B B A ...) in the same process, so
clock and thermal drift hit both alike. Timing primitives are bound at import, before any candidate
is loaded, so a candidate that patches ``torch.cuda.Event`` cannot change what we measure (it is
also rejected: see ``_guard.StateSnapshot``).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

_perf = time.perf_counter
_Event = torch.cuda.Event
_sync = torch.cuda.synchronize

# Adaptive repetitions: aim at this much timed work per callable, within these bounds.
GPU_TARGET_MS = 300.0
GPU_MIN_REPS, GPU_MAX_REPS = 25, 2000
WARMUP_MS = 30.0
CPU_TARGET_S = 1.0
CPU_MIN_REPS, CPU_MAX_REPS = 3, 20


def quantiles(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)

    def q(p: float) -> float:
        k = (len(s) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"median_ms": statistics.median(s), "p20_ms": q(0.2), "p80_ms": q(0.8), "reps": len(s)}


class L2Flush:
    """A buffer twice the L2 size, zeroed before each repetition so every one starts cold."""

    def __init__(self, device: torch.device) -> None:
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 64 << 20) or (64 << 20)
        self.buf = torch.empty(max(2 * l2, 64 << 20), dtype=torch.int8, device=device)

    def __call__(self) -> None:
        self.buf.zero_()


def time_gpu(fns: dict[str, Callable[[], Any]], flush: L2Flush, target_ms: float = GPU_TARGET_MS) -> dict[str, dict]:
    """Median/p20/p80 in ms of each callable, interleaved, L2 flushed before every repetition."""
    names = list(fns)
    # warm-up, and an estimate of each callable's time for the repetition count
    est = {}
    for n in names:
        fns[n]()
        _sync()
        t0, k = _perf(), 0
        while k < 3 or ((_perf() - t0) * 1e3 < WARMUP_MS and k < 1000):
            fns[n]()
            k += 1
        _sync()
        est[n] = max((_perf() - t0) * 1e3 / k, 1e-3)
    slowest = max(est.values())
    reps = int(min(GPU_MAX_REPS, max(GPU_MIN_REPS, target_ms / slowest)))
    events = {n: [(_Event(enable_timing=True), _Event(enable_timing=True)) for _ in range(reps)] for n in names}
    for i in range(reps):
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            flush()
            s, e = events[n][i]
            s.record()
            fns[n]()
            e.record()
    _sync()
    out = {}
    for n in names:
        out[n] = quantiles([s.elapsed_time(e) for s, e in events[n]])
        out[n]["estimate_ms"] = est[n]
    return out


def side_stream_leftover(fn: Callable[[], Any], reps: int = 3) -> dict[str, float]:
    """Work still running on the device after the current stream's end event completed.

    A candidate that launches its work on a side stream without making the current stream wait
    looks instantaneous to events on the current stream; the device-wide synchronize right after
    the end event is then what waits for the real work."""
    leftovers, event_ms = [], []
    for _ in range(reps):
        _sync()
        s, e = _Event(enable_timing=True), _Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        t0 = _perf()
        _sync()
        leftovers.append((_perf() - t0) * 1e3)
        event_ms.append(s.elapsed_time(e))
    return {"leftover_ms": statistics.median(leftovers), "event_ms": statistics.median(event_ms)}


def time_cpu(fns: dict[str, Callable[[], Any]], target_s: float = CPU_TARGET_S) -> dict[str, dict]:
    """Wall-clock timings in the interpreter (marked ``interpreted``: never a speedup claim)."""
    names = list(fns)
    est = {}
    for n in names:
        t0 = _perf()
        fns[n]()
        est[n] = _perf() - t0
    reps = int(min(CPU_MAX_REPS, max(CPU_MIN_REPS, target_s / max(sum(est.values()), 1e-6))))
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(reps):
        for n in (names if i % 2 == 0 else names[::-1]):
            t0 = _perf()
            fns[n]()
            times[n].append((_perf() - t0) * 1e3)
    return {n: quantiles(times[n]) for n in names}
