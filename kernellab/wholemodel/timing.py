"""Timing: eager, patched and torch.compile side by side."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kernellab.wholemodel.profiling import _call, _device_of, _sync


def _time(fn: Callable[[], Any], device: str, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def time_models(model: nn.Module, patched: nn.Module, inputs: list, reps: int | None = None,
                rounds: int = 5) -> dict:
    """Eager, the patched model and (on a GPU) ``torch.compile`` of the whole model, timed side by
    side in this process: rounds interleaved, the median of all repetitions with p20/p80. On a CPU
    the patched kernels run in the Triton interpreter: times are reported, speedups are not."""
    device = _device_of(model, inputs)
    reps = reps or (20 if device == "cuda" else 2)
    runners: dict[str, Callable[[], Any]] = {"eager": lambda: _call(model, inputs),
                                             "patched": lambda: _call(patched, inputs)}
    note = None
    if device == "cuda":
        compiled = torch.compile(model)
        runners["compile"] = lambda: _call(compiled, inputs)
    else:
        note = "CPU: the patched kernels run in the Triton interpreter; no speedup is claimed, torch.compile not timed"
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for fn in runners.values():  # warm-up (compiles)
        fn()
        fn()
    _sync(device)
    for _ in range(rounds):
        for k, fn in runners.items():
            samples[k] += _time(fn, device, reps)

    def stats(xs: list[float]) -> dict:
        xs = sorted(xs)
        q = statistics.quantiles(xs, n=5) if len(xs) > 1 else [xs[0]] * 4
        return {"median_ms": statistics.median(xs), "p20_ms": q[0], "p80_ms": q[3], "reps": len(xs)}

    out: dict[str, Any] = {"device": device, "interpreted": device != "cuda", "note": note}
    for k, xs in samples.items():
        out[k] = stats(xs)
    if device == "cuda":
        out["speedup_vs_eager"] = out["eager"]["median_ms"] / out["patched"]["median_ms"]
        out["speedup_vs_compile"] = out["compile"]["median_ms"] / out["patched"]["median_ms"]
        out["compile_vs_eager"] = out["eager"]["median_ms"] / out["compile"]["median_ms"]
    return out
