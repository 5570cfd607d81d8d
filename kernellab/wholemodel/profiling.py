"""Unit profiling: forward hooks time each unit on the example inputs."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from kernellab.wholemodel.units import Unit


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _device_of(model: nn.Module, inputs: list) -> str:
    for t in [*inputs, *model.parameters()]:
        if isinstance(t, torch.Tensor):
            return t.device.type
    return "cpu"


def _call(model: nn.Module, inputs: list, seed: int | None = None, kwargs: dict | None = None) -> Any:
    if seed is not None:  # dropout in training mode: the same draws for the reference and the patch
        torch.manual_seed(seed)
    with torch.no_grad():
        return model(*inputs, **(kwargs or {}))


@contextlib.contextmanager
def _hooks(units: list[Unit], times: dict[str, list], calls: dict[str, list] | None) -> Iterator[None]:
    """Forward hooks timing each unit (from its first module's pre-hook to its last's post-hook) and,
    with ``calls``, recording its inputs."""
    handles = []
    cuda = torch.cuda.is_available()
    for u in units:
        first, last = u.first_last()
        state: dict[str, Any] = {}

        def pre(mod: nn.Module, args: tuple, kwargs: dict, u: Unit = u, state: dict = state) -> None:
            if calls is not None:
                calls.setdefault(u.label, []).append((args, kwargs))
            on_gpu = cuda and any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            if on_gpu:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                state["t0"] = ev
            else:
                state["t0"] = time.perf_counter()

        def post(mod: nn.Module, args: tuple, out: Any, u: Unit = u, state: dict = state) -> None:
            t0 = state.pop("t0", None)
            if t0 is None:
                return
            if isinstance(t0, float):
                times.setdefault(u.label, []).append(("s", time.perf_counter() - t0))
            else:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                times.setdefault(u.label, []).append(("ev", (t0, ev)))

        handles.append(first.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(last.register_forward_hook(post))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _seconds(samples: list) -> float:
    total = 0.0
    for kind, v in samples:
        total += v if kind == "s" else v[0].elapsed_time(v[1]) / 1e3
    return total


def profile_units(model: nn.Module, inputs: list, units: list[Unit], reps: int | None = None) -> dict:
    """Time the model and each unit on ``inputs`` (after a warm-up call that also records each unit's
    arguments). Returns ``{"total_s", "share": {label: fraction}, "calls": {label: [(args, kwargs)]}}``;
    each share is the median over ``reps`` repetitions of the unit's time over the model's forward time."""
    device = _device_of(model, inputs)
    reps = reps or (10 if device == "cuda" else 5)
    calls: dict[str, list] = {}
    with _hooks(units, {}, calls):
        _call(model, inputs, seed=0)
    _sync(device)
    per_rep: list[tuple[float, dict[str, list]]] = []
    for i in range(reps):
        times: dict[str, list] = {}
        with _hooks(units, times, None):
            _sync(device)
            t0 = time.perf_counter()
            _call(model, inputs, seed=i)
            _sync(device)
            per_rep.append((time.perf_counter() - t0, times))
    # the median over repetitions of each share: one slow repetition (a busy machine) moves no ranking
    total = statistics.median(t for t, _ in per_rep)
    share = {u.label: statistics.median(min(1.0, _seconds(times.get(u.label, [])) / t) if t > 0 else 0.0
                                        for t, times in per_rep) for u in units}
    return {"total_s": total, "share": share, "calls": calls, "device": device}
