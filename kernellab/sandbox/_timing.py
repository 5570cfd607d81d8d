"""Timing in the worker: CUDA events with L2 flushes on the GPU, wall clock in the CPU interpreter.

The candidate and the eager reference are timed interleaved (A B B A ...) in the same process, so
clock and thermal drift hit both alike. Each callable may come with a ``prepare`` step, run before
each of its timed repetitions outside the timed region (the caller writes fresh values into the
inputs there, so no repetition can be served from a cache), told whether it is the last one. Timing primitives are bound at import, before any candidate
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
_sleep = torch.cuda._sleep

# Adaptive repetitions: aim at this much timed work per callable, within these bounds.
GPU_TARGET_MS = 300.0
GPU_MIN_REPS, GPU_MAX_REPS = 25, 2000
WARMUP_MS = 30.0
CPU_TARGET_S = 1.0
CPU_MIN_REPS, CPU_MAX_REPS = 3, 20
# A cheaper timing (``target_ms`` below GPU_TARGET_MS, as Optuna trials ask) scales the target and
# the repetition bounds by target_ms / GPU_TARGET_MS, but never below this many GPU repetitions:
# a median of fewer L2-flushed runs is too noisy to rank configurations by.
GPU_QUICK_MIN_REPS = 10
# Early stop: the candidate's median over this many first repetitions is compared with the limit.
EARLY_REPS_GPU, EARLY_REPS_CPU = 5, 3


def rep_bounds(device: str, target_ms: float | None = None) -> tuple[float, int, int]:
    """(target, min_reps, max_reps) of a timing: target in ms on ``cuda``, in s on ``cpu``.

    ``target_ms=None`` is the full timing. Otherwise the ratio r = target_ms / GPU_TARGET_MS sets the
    target (GPU: target_ms; CPU: r x CPU_TARGET_S, the interpreter's wall clock shortened alike) and,
    capped at 1, shrinks the repetition bounds, so that a quick timing of a fast kernel (which would
    hit the maximum either way) also runs fewer repetitions."""
    if target_ms is None:
        return (GPU_TARGET_MS, GPU_MIN_REPS, GPU_MAX_REPS) if device == "cuda" else (CPU_TARGET_S, CPU_MIN_REPS,
                                                                                     CPU_MAX_REPS)
    if not (isinstance(target_ms, (int, float)) and math.isfinite(target_ms) and target_ms > 0):
        raise ValueError(f"timing target must be a positive number of ms, got {target_ms!r}")
    r = target_ms / GPU_TARGET_MS
    shrink = min(1.0, r)
    if device == "cuda":
        lo = max(GPU_QUICK_MIN_REPS, round(GPU_MIN_REPS * shrink)) if shrink < 1 else GPU_MIN_REPS
        return float(target_ms), lo, max(lo, round(GPU_MAX_REPS * shrink))
    return CPU_TARGET_S * r, CPU_MIN_REPS, max(CPU_MIN_REPS, round(CPU_MAX_REPS * shrink))


def _early_stop(times: list[float], stop_above_ms: float | None, reps: int, first: int) -> bool:
    """Whether the median of the first repetitions is already above the limit (only when stopping
    would skip repetitions: a timing that is over anyway is complete, not stopped)."""
    return stop_above_ms is not None and reps > first and statistics.median(times[:first]) > stop_above_ms


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


def time_gpu(fns: dict[str, Callable[[], Any]], flush: L2Flush, target_ms: float | None = None, *,
             stop_above_ms: float | None = None, stop_on: str | None = None,
             prepare: dict[str, Callable[[], Any]] | None = None) -> dict[str, dict]:
    """Median/p20/p80 in ms of each callable, interleaved, L2 flushed before every repetition.
    ``prepare[name](last)`` (optional) runs before the warm-up and before every timed repetition of
    that callable, next to the flush and outside the events; ``last`` is True before the last planned
    repetition (never reached when stopped early).

    ``target_ms``: see :func:`rep_bounds` (None: the full timing). ``stop_above_ms``: after the first
    EARLY_REPS_GPU repetitions, when the median of ``stop_on`` (default: the first callable) is above
    it, stop there; every callable then reports those first repetitions (``early_stopped`` True).
    Each entry also has ``reps`` (timed), ``planned_reps`` and ``estimate_ms`` (from the warm-up)."""
    names = list(fns)
    target, lo, hi = rep_bounds("cuda", target_ms)
    # warm-up, and an estimate of each callable's time for the repetition count
    prep = prepare or {}
    est = {}
    for n in names:
        if n in prep:
            prep[n]()
        fns[n]()
        _sync()
        # synchronised call by call: unsynchronised, the loop measured only the launches, queued as many
        # calls as it could launch in WARMUP_MS (hundreds), then waited for all of them -- 3 s of a 5.5 ms
        # GEMM before every timing, inside the GPU's timing lock (sandbox bench, H200)
        # The estimate is the fastest call, not the mean: on a loaded host (12 test workers on 2 GPUs) the mean of
        # a 0.15 ms kernel's synchronised calls was 10 ms, and the full timing ran 28 repetitions, fewer than a
        # quick one planned from a calmer warm-up
        t0, k, fastest = _perf(), 0, math.inf
        while k < 3 or ((_perf() - t0) * 1e3 < WARMUP_MS and k < 1000):
            t1 = _perf()
            fns[n]()
            _sync()
            fastest = min(fastest, _perf() - t1)
            k += 1
        est[n] = max(fastest * 1e3, 1e-3)
    slowest = max(est.values())
    reps = int(min(hi, max(lo, target / slowest)))
    events = {n: [(_Event(enable_timing=True), _Event(enable_timing=True)) for _ in range(reps)] for n in names}
    watched = stop_on or names[0]
    done = reps
    for i in range(reps):
        if i == EARLY_REPS_GPU and stop_above_ms is not None:
            _sync()  # the first repetitions must be finished to be read
            if _early_stop([s.elapsed_time(e) for s, e in events[watched][:i]], stop_above_ms, reps, i):
                done = i
                break
        order = names if i % 2 == 0 else names[::-1]
        for n in order:
            if n in prep:
                prep[n](i == reps - 1)
            flush()
            s, e = events[n][i]
            s.record()
            fns[n]()
            e.record()
    _sync()
    out = {}
    for n in names:
        out[n] = quantiles([s.elapsed_time(e) for s, e in events[n][:done]])
        out[n].update(estimate_ms=est[n], planned_reps=reps, early_stopped=done < reps)
    return out


_CYCLES_PER_MS: list[float] = []


def spin_cycles(ms: float) -> int:
    """Cycles of ``torch.cuda._sleep`` (a one-thread ``spin_kernel`` on the current stream) that hold that stream
    about ``ms``; the rate is measured once per process."""
    if not _CYCLES_PER_MS:
        _sync()
        s, e = _Event(enable_timing=True), _Event(enable_timing=True)
        s.record()
        _sleep(1_000_000)
        e.record()
        e.synchronize()
        _CYCLES_PER_MS.append(1_000_000 / max(s.elapsed_time(e), 1e-3))
    return int(ms * _CYCLES_PER_MS[0])


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


def time_cpu(fns: dict[str, Callable[[], Any]], target_ms: float | None = None, *,
             stop_above_ms: float | None = None, stop_on: str | None = None,
             prepare: dict[str, Callable[[], Any]] | None = None) -> dict[str, dict]:
    """Wall-clock timings in the interpreter (marked ``interpreted``: never a speedup claim).
    ``target_ms``, ``stop_above_ms``, ``prepare`` and the entries as in :func:`time_gpu` (the early
    check comes after EARLY_REPS_CPU repetitions)."""
    names = list(fns)
    target_s, lo, hi = rep_bounds("cpu", target_ms)
    prep = prepare or {}
    est = {}
    for n in names:
        if n in prep:
            prep[n]()
        t0 = _perf()
        fns[n]()
        est[n] = _perf() - t0
    reps = int(min(hi, max(lo, target_s / max(sum(est.values()), 1e-6))))
    watched = stop_on or names[0]
    times: dict[str, list[float]] = {n: [] for n in names}
    done = reps
    for i in range(reps):
        if i == EARLY_REPS_CPU and _early_stop(times[watched], stop_above_ms, reps, i):
            done = i
            break
        for n in (names if i % 2 == 0 else names[::-1]):
            if n in prep:
                prep[n](i == reps - 1)
            t0 = _perf()
            fns[n]()
            times[n].append((_perf() - t0) * 1e3)
    out = {}
    for n in names:
        out[n] = quantiles(times[n])
        out[n].update(estimate_ms=est[n] * 1e3, planned_reps=reps, early_stopped=done < reps)
    return out
