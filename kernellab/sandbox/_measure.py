"""What a job measures: the torch.compile baseline, the candidate's timing, its own kernels' share.

Before the candidate exists, :func:`_baseline` (the cached torch.compile baseline, timed against eager) or
:func:`_compile_reference` (a re-timing's own torch.compile). Once its trials passed, :func:`_timing` times it
against eager on fresh inputs before each repetition (``_reference._Fresh``), with the side-stream leftover
check, and :func:`_check_last` checks the last timed output; :func:`_kernel_share` profiles the share of the
time in the candidate's own kernels, with the busy check (:func:`_busy_check`) against work escaping the timed
stream. Kept apart from the trials (``_trials``): these are measurements, whose checks guard the measurement.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from kernellab.problem import output_tensors
from kernellab.vocab import SEED, share_wins

from ._check import (
    check_structure,
    clone_all,
    compare,
)
from ._protocol import JobSpec, Phase
from ._reference import _FINAL_TRIAL, FRESH_EVERY, _Fresh, _InfraFault, _reseed, _sync
from ._result import (
    Incorrect,
    Rejected,
    is_oom,
    truncate,
)
from ._timing import _Event, _sleep, side_stream_leftover, spin_cycles, time_cpu, time_gpu
from ._trials import _call, _integrity, vouch

# side-stream work: leftover device time after the end event beyond this (ms, or share of the event time)
LEFTOVER_MS, LEFTOVER_SHARE = 0.1, 0.5
# the busy check (_busy_check): an honest call's busy time is at most its event time; the margin covers the
# two clocks' resolution. The spin kernel before each profiled call: 3x the fastest call, within these bounds.
BUSY_FACTOR, BUSY_MARGIN_MS = 1.25, 0.05
SPIN_MIN_MS, SPIN_MAX_MS = 2.0, 50.0


def _baseline(w: Any, state: dict) -> dict:
    """torch.compile of the reference, timed interleaved with eager (before the candidate exists)."""
    model, x = state["ref_model"], state["trials"][0]["inputs"]
    out: dict[str, Any] = {}
    try:
        compiled = torch.compile(model)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*x)
        _sync(w.device)
        out["compile_seconds"] = time.perf_counter() - t0
    except Exception as exc:
        if is_oom(exc):  # the card was short, not torch.compile: measure it again in a later job
            raise _InfraFault("oom", f"torch.compile of the reference ran out of memory: {type(exc).__name__}: "
                                     f"{exc}") from exc
        return {"compile_ms": None, "error": truncate(f"{type(exc).__name__}: {exc}", 1000)}
    w.lock()
    state["locked"] = True
    try:
        with torch.no_grad():
            t = time_gpu({"compile": lambda: compiled(*x), "eager": lambda: model(*x)}, w.flush)
    finally:
        w.unlock()
        state["locked"] = False
    out.update(compile_ms=t["compile"]["median_ms"], compile_p20_ms=t["compile"]["p20_ms"],
               compile_p80_ms=t["compile"]["p80_ms"], eager_ms=t["eager"]["median_ms"])
    return out


def _compile_reference(w: Any, state: dict, d: dict) -> None:
    """torch.compile of the reference, compiled here (before the candidate exists, like the
    reference outputs) so that :func:`_timing` can time it interleaved with the candidate."""
    model, x = state["ref_model"], state["trials"][0]["inputs"]
    try:
        compiled = torch.compile(model)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(*clone_all(x))
        _sync(w.device)
    except Exception as exc:
        d["compile_error"] = truncate(f"{type(exc).__name__}: {exc}", 1000)
        return
    d["compile_seconds"] = time.perf_counter() - t0
    state["compiled"] = compiled


def _timing(w: Any, job: JobSpec, state: dict, model: Any, d: dict, r: dict) -> None:
    """Time the candidate against eager, on fresh inputs before each repetition (see _Fresh), then
    check the last timed output; ``job``'s ``timing_target_ms`` (a cheaper timing) and
    ``stop_above_ms`` (early stop on the first repetitions' median) go to the timing functions."""
    x = state["trials"][0]["inputs"]
    # the same sequence of values for both: the eager reference gets the very inputs the candidate gets
    fc, fr = _Fresh(x, state["timing"]["base"], SEED + 7), _Fresh(x, state["timing"]["base"], SEED + 7)
    ref_model = state["ref_model"]
    watch = state["watch"]
    target_ms, stop_above = job.timing_target_ms, job.stop_above_ms
    last: dict[str, Any] = {}

    def cand() -> Any:
        if fc.last:  # the checked repetition draws the random numbers its reference drew (dropout)
            _reseed(_FINAL_TRIAL)
        watch.armed = True
        try:
            last["out"] = model(*fc.current)
            return last["out"]
        finally:
            watch.armed = False

    prepare = {"candidate": fc, "eager": fr}
    with torch.no_grad():
        if w.device_kind == "cuda":
            w.lock()
            state["locked"] = True
            w.phase(Phase.TIMING)
            t_start = time.time()
            left = side_stream_leftover(cand)
            d["side_stream_check"] = left
            if left["leftover_ms"] > max(LEFTOVER_MS, LEFTOVER_SHARE * left["event_ms"]):
                raise Rejected("side_stream_escape",
                               f"{left['leftover_ms']:.3f} ms of device work was still running after the timed "
                               f"region ended ({left['event_ms']:.3f} ms by events): work escapes on a side stream")
            fns = {"candidate": cand, "eager": lambda: ref_model(*fr.current)}
            if state.get("compiled") is not None:  # a re-timing: torch.compile in the same interleaving
                compiled, fk = state["compiled"], _Fresh(x, state["timing"]["base"], SEED + 7)
                fns["compile"], prepare["compile"] = (lambda: compiled(*fk.current)), fk
            t = time_gpu(fns, w.flush, target_ms, stop_above_ms=stop_above, stop_on="candidate", prepare=prepare)
            d["timing_window"] = (t_start, time.time())  # wall clock, to show one timing per GPU at a time
            # still holding the GPU: the pool's other jobs do not stretch the profiled kernels (8 jobs sharing
            # the H200 stretched them 2x), and the busy check sees the card as the timing did
            w.phase(Phase.KERNEL_SHARE)
            # (on the timing's own inputs: a clone would be a seventh copy the memory grant does not count)
            _kernel_share(w, state, model, d, r, call_ms=t["candidate"]["estimate_ms"], inputs=fc.current,
                          integrity=False)  # _integrity(state, "timing") below, once grad mode is back
            state["shared_measured"] = True
            w.unlock()
            state["locked"] = False
        else:
            w.phase(Phase.TIMING)
            t = time_cpu({"candidate": cand, "eager": lambda: ref_model(*fr.current)}, target_ms,
                         stop_above_ms=stop_above, stop_on="candidate", prepare=prepare)
            d["compile"] = "torch.compile is not measured on the CPU interpreter"
    if not fc.last:  # stopped early: one more call, untimed, on the last mix in the tensors timed last
        with torch.no_grad():
            fc(last=True, same_tensors=True)
            cand()
    _integrity(state, "timing")
    _check_last(w, state, model, fc.current, last.get("out"), d)
    c, e = t["candidate"], t["eager"]
    r.update(median_ms=c["median_ms"], p20_ms=c["p20_ms"], p80_ms=c["p80_ms"], eager_ms=e["median_ms"])
    d["timing"] = {"candidate": c, "eager": e, "method": "cuda events, L2 flushed, interleaved"
                   if w.device_kind == "cuda" else "wall clock, Triton interpreter",
                   "fresh_inputs": f"mixed anew before each repetition, new tensors every {FRESH_EVERY}",
                   "target_ms": target_ms, "stop_above_ms": stop_above}
    if "compile" in t:
        r["compile_ms"] = t["compile"]["median_ms"]
        d["timing"]["compile"] = t["compile"]
    # a partial timing: its medians cover the first repetitions only (the tuner prunes such trials)
    d["early_stopped"] = bool(c["early_stopped"])


def _new_addresses(xs: list) -> list:
    """Copies at addresses no allocation ever starts at (16 bytes past a 64-byte boundary, still
    aligned for vector loads), so no cache keyed on addresses can know them."""
    out = []
    for x in xs:
        if not isinstance(x, torch.Tensor) or x.numel() == 0 or 16 % x.element_size():
            out.append(x.clone() if isinstance(x, torch.Tensor) else x)
            continue
        pad = 16 // x.element_size()
        span = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride(), strict=True))
        buf = torch.empty(span + 64 // x.element_size(), dtype=x.dtype, device=x.device)
        shift = (-(buf.data_ptr() // x.element_size()) + pad) % (64 // x.element_size())
        y = buf.as_strided(x.shape, x.stride(), shift)
        y.copy_(x)
        out.append(y)
    return out


def _check_last(w: Any, state: dict, model: Any, xin: list, out: Any, d: dict) -> None:
    """The last timed output must be right for the last timed inputs (FINAL_MIX, whose reference was
    computed before the candidate was loaded). When it is not, the candidate runs once more on those
    values in new tensors: right there means the timed call handed back an earlier result."""
    _sync(w.device)
    ref, prints = state["timing"]["final_ref"], state["timing"]["final_prints"]
    atol, rtol = state["atol"], state["rtol"]

    def wrong(o: Any) -> str | None:
        bad = check_structure(ref, o, device=w.device)
        if bad:
            return bad[1]
        for k, (rf, ot) in enumerate(zip(ref, output_tensors(o), strict=False)):
            c = compare(rf, ot, atol, rtol, sums=True)
            vouch(rf, c, prints[k], f"output {k} of the last timed repetition")
            if not c["ok"]:
                return f"output {k}: {c['message']}"
        return None

    msg = wrong(out)
    if msg is None:
        d["last_timed_output"] = "checked"
        return
    again = wrong(_call(state, model, _new_addresses(xin), trial=_FINAL_TRIAL))
    _sync(w.device)
    _integrity(state, "after timing")
    if again is None:
        raise Rejected("cached_result", "the last timed repetition's output was wrong for the fresh values written "
                                        f"into its inputs ({msg}), yet right on the same values in new tensors: "
                                        "results are reused across calls")
    raise Incorrect("mismatch", f"the last timed repetition (inputs mixed from two samples): {msg}")


def _kernel_share(w: Any, state: dict, model: Any, d: dict, r: dict, call_ms: float | None = None,
                  inputs: list | None = None, integrity: bool = True) -> None:
    """Share of the time in the candidate's own kernels: those it launched (names recorded by the
    worker's launch hooks, never read from the source, whose comments can say anything). With
    ``call_ms`` (the timing's fastest synchronised call, launches included), also the busy check
    (:func:`_busy_check`): each profiled call then starts behind a spin kernel that long, three times.
    ``integrity=False``: the caller checks the integrity after it (inside the timing, grad mode is off on
    purpose, and a check there would take that for the candidate's change)."""
    if w.device_kind != "cuda":
        # Interpreter: the share of the candidate's forward time spent inside its own kernel launches.
        fs = state.get("forward_s") or 0.0
        r["own_kernel_share"] = min(1.0, state["launch_s"] / fs) if fs > 0 else 0.0
        r["library_only"] = state["launches"] == 0
        d["own_kernel_launches"] = state["launches"]
        d["own_kernels"] = sorted(w.counter.names)
        d["kernel_win_eligible"] = share_wins(r["library_only"], r["own_kernel_share"])
        return
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    x = inputs if inputs is not None else clone_all(state["trials"][0]["inputs"])
    spin = spin_cycles(min(SPIN_MAX_MS, max(SPIN_MIN_MS, 3 * call_ms))) if call_ms is not None else 0
    fences = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            if spin:
                _sleep(spin)
                start, end = _Event(enable_timing=True), _Event(enable_timing=True)
                start.record()
            _call(state, model, x)
            if spin:
                end.record()
                fences.append((start, end))
        torch.cuda.synchronize()
    if integrity:
        _integrity(state, "profiling")
    own = set(w.counter.names)  # launched in the trials, the follow check and the profiled calls
    total = mine = 0.0
    kernels: dict[str, float] = {}
    spins, calls = [], []  # our spin kernels apart from the call's own work
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            (spins if spin and "spin_kernel" in e.name and not _is_own(e.name, own) else calls).append(e)
    if spin:
        _busy_check(calls, spins, fences, d)
    for e in calls:
        us = e.time_range.elapsed_us()
        total += us
        kernels[e.name] = kernels.get(e.name, 0.0) + us
        if _is_own(e.name, own):
            mine += us
    r["own_kernel_share"] = mine / total if total > 0 else 0.0
    r["library_only"] = mine == 0.0
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:10]
    d["kernels"] = [{"name": k[:120], "us_per_call": v / 3, "own": _is_own(k, own)} for k, v in top]
    d["own_kernels"] = sorted(own)
    d["kernel_win_eligible"] = share_wins(r["library_only"], r["own_kernel_share"])


def _busy_check(calls: list, spins: list, fences: list, d: dict) -> None:
    """Device work of the profiled calls outside their own timed window: the union of every kernel's
    interval (any stream, CUPTI's device clock) against the call's events on the current stream.

    Each call starts behind a spin kernel on the current stream, longer than the host takes to launch
    the call, so the check does not depend on how fast the host is: work queued behind the call's
    stream (``side.wait_stream(current)``) starts after the start event and, never joined, runs past
    the end event; work that waits for nothing runs during the spin, before the start event. Either way
    the device is busy longer than the events say. The leftover check before the timing reads host
    clocks and is blind when the host is slow: with 12 test workers on the H200 a side stream's 60
    kernels finished while the host was still launching them, and the candidate was judged correct.
    An honest call's kernels all lie between its events, on a shared GPU too (both clocks stretch)."""
    if len(spins) < len(fences):  # the spin kernel not seen by that name: no verdict from a check that cannot see
        d["busy_check"] = {"skipped": f"{len(spins)} spin kernels found in the profile for {len(fences)} calls"}
        return
    busy_ms = union_length([(e.time_range.start, e.time_range.end) for e in calls]) / len(fences) / 1e3
    event_ms = sum(s.elapsed_time(e) for s, e in fences) / len(fences)
    d["busy_check"] = {"busy_ms": busy_ms, "event_ms": event_ms}
    if busy_ms > BUSY_FACTOR * event_ms + BUSY_MARGIN_MS:
        raise Rejected("side_stream_escape",
                       f"the device was busy {busy_ms:.3f} ms per call (every kernel, any stream) but the call's "
                       f"events on its stream span {event_ms:.3f} ms: work escapes the timed stream")


def union_length(spans: list[tuple[float, float]]) -> float:
    """The length of the union of intervals: overlapping kernels on two streams count once."""
    busy, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            busy += b - max(a, end)
            end = b
    return busy


def _kernel_key(name: str) -> str:
    """A kernel name without what a demangled C++ name adds around it: the ``void`` return type and
    the argument list (``void ns::k<float>(float const*, int)`` -> ``ns::k<float>``), spaces dropped.
    Namespaces and template arguments stay: ``at::native::vectorized_elementwise_kernel<4, ...>`` is
    never ``vectorized_elementwise_kernel``."""
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    if s.endswith(")"):
        depth = 0
        for i in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[i], 0)
            if depth == 0:
                s = s[:i]
                break
    return s.replace(" ", "")


def _is_own(kernel: str, own: set[str]) -> bool:
    """Whether a profiled kernel is one the candidate launched: Triton and ``extern "C"`` CuPy
    kernels appear under exactly the name they were launched by; a templated CuPy kernel
    (``get_function("k<float>")``) appears as ``void k<float>(...)``."""
    key = _kernel_key(kernel)
    return bool(key) and key in {_kernel_key(n) for n in own}
