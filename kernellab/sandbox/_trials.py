"""The candidate's correctness trials and the integrity checks around its calls.

:func:`_trials` calls the candidate on every trial's inputs (freed memory poisoned first, :func:`_poison`; on
the CPU torch's fill of uninitialised memory instead, :func:`_filled_empty`), then checks its outputs: their
structure, aliasing with inputs or earlier outputs, poisoned memory never written (:func:`_has_poison`),
modified inputs, and the values against the reference (:func:`_compare_trial`, with the fp64 anchor for the
synthetic distributions); :func:`_integrity` rejects a candidate that called the reference or changed torch's
state; :func:`_follow` checks that outputs follow new values written into the same input tensors. What the
trials are compared with comes from ``_reference``; the timing that follows them is ``_measure``'s.
"""

from __future__ import annotations

import contextlib
import time
import warnings
from typing import Any

import torch

from kernellab.problem import output_tensors

from ._check import (
    _WORD,
    LARGE_SCALE,
    anchored,
    check_structure,
    clone_all,
    compare,
    judge_null,
    modified_inputs,
    overlaps,
)
from ._gpu import POISON_CAP
from ._protocol import JobSpec
from ._reference import _fingerprint, _ProblemFault, _reseed, _sync, _Trial
from ._result import (
    Incorrect,
    Rejected,
    is_oom,
)

# A poison word no arithmetic produces: a *signalling* NaN in fp32 (its upper half, 0x7FBA, is a
# signalling NaN in fp16 and bf16 too). Computed NaNs are quiet, so finding it in an output means
# the candidate returned memory it never wrote.
POISON32 = 0x7FBADBAD
POISON16 = 0x7FBA


def _poison(sizes: list[tuple[int, torch.device]], copies: int = 4, cap: int = POISON_CAP) -> int:
    """Fill freed blocks of ``sizes`` with the poison word, then free them for the candidate's
    allocations to land on. One block per size always (the candidate's outputs are the point), more
    copies while the total stays within ``cap``: a job holds one trial, not four copies of it.
    Returns the bytes written."""
    keep, total = [], 0
    for k in range(copies):
        for n, d in sizes:
            if k and total + n > cap:
                continue
            keep.append(torch.full((max(1, n // 4),), POISON32, dtype=torch.int32, device=d))
            total += n
    del keep
    return total


# On the CPU torch allocates through glibc malloc, whose reuse of freed blocks _poison cannot steer
# (about one run in ten handed the candidate a block it had not poisoned). There the candidate runs
# with torch's deterministic mode on (warnings only), which fills every tensor torch.empty returns
# with a *positive* quiet NaN; NaNs computed on x86 are negative (0xFFC00000), so an output made
# only of that NaN where the reference has numbers is memory the candidate never wrote.
_FILL_NAN = {torch.float64: 0x7FF8000000000000, torch.float32: 0x7FC00000, torch.float16: 0x7E00,
             torch.bfloat16: 0x7FC0}


@contextlib.contextmanager
def _filled_empty(on: bool):
    if not on:
        yield
        return
    was, warn = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    # torch.use_deterministic_algorithms would also import torch._inductor (and so torch._dynamo,
    # which wraps torch.manual_seed: the state snapshot would take that for the candidate's doing)
    torch._C._set_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "... does not have a deterministic implementation"
            yield
    finally:
        torch._C._set_deterministic_algorithms(was, warn_only=warn)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def _has_poison(t: torch.Tensor, ref: torch.Tensor) -> bool:
    if not t.is_floating_point() or t.numel() == 0:
        return False
    t = t.detach().contiguous()
    word = _WORD.get(t.element_size())
    if word is None:
        return False
    bits = t.view(word)
    poison = {4: POISON32, 2: POISON16}.get(t.element_size())
    if poison is not None and bool((bits == poison).any()):
        return True
    # A single NaN written by the candidate (`y[0] = float("nan")`) has the fill's bits too: only an
    # output that is the fill throughout, where the reference has numbers, is memory never written.
    if t.device.type == "cpu" and t.dtype in _FILL_NAN and ref.shape == t.shape:
        return bool((bits == _FILL_NAN[t.dtype]).all()) and not bool(ref.detach().isnan().any())
    return False


def _call(state: dict, model: Any, inputs: list, trial: int | None = None) -> Any:
    watch, counter = state["watch"], state["counter"]
    if trial is not None:
        _reseed(trial)
    watch.armed = counter.armed = True
    try:
        with torch.no_grad():
            return model(*inputs)
    finally:
        watch.armed = counter.armed = False


def _integrity(state: dict, where: str) -> None:
    if state["watch"].calls:
        raise Rejected("reference_called", f"the candidate called the reference Model.forward ({where})",
                       calls=state["watch"].calls)
    changed = state["snapshot"].diff()
    if changed:
        reason, names = changed
        raise Rejected(reason, f"the candidate changed {', '.join(names)} ({where})", names=names)


def _trials(w: Any, job: JobSpec, state: dict, model: Any, d: dict, r: dict, first_phase_done: Any) -> None:
    dev = w.device
    state["counter"] = w.counter
    w.counter.reset()
    forward_s = 0.0
    # reference outputs on the same device as the candidate's (the CPU worker) can be aliased
    refs_here: list[torch.Tensor] = [t for tr in state["trials"] for t in tr["ref"] if t.device == dev]
    # The previous trial's outputs stay alive until this trial's are checked: a candidate returning
    # one static buffer every call is caught by address; fingerprints of older outputs catch a
    # result cached across calls. Older outputs are freed: one trial at a time on the device.
    prev: list[torch.Tensor] = []
    prev_prints: list[list] = []
    per_trial = d.setdefault("trials", [])
    max_abs = max_rel = 0.0
    cap = int(job.poison_cap or POISON_CAP)
    windows = d.setdefault("trial_windows", []) if dev.type == "cuda" else []
    for i, tr in enumerate(state["trials"]):
        w.read()
        spans: list = []
        w.record_spans(spans if dev.type == "cuda" else None)  # wall clock: no trial overlaps another job's timing
        xin = tr["inputs"]
        sizes = [(t.numel() * t.element_size(), dev) for t in tr["ref"]]
        sizes += [(t.untyped_storage().nbytes(), t.device) for t in xin if isinstance(t, torch.Tensor)]
        _poison(sizes, cap=cap)
        _sync(dev)
        t0 = time.perf_counter()
        with _filled_empty(dev.type == "cpu"):
            out = _call(state, model, xin, trial=i)
        _sync(dev)
        forward_s += time.perf_counter() - t0
        if i == 0:
            first_phase_done()
        _integrity(state, f"trial {i}")
        bad = check_structure(tr["ref"], out, device=dev)
        if bad:
            raise Incorrect(bad[0], f"trial {i} ({tr['dist']}): {bad[1]}")
        outs = output_tensors(out)
        del out
        for k, o in enumerate(outs):
            if any(isinstance(x, torch.Tensor) and overlaps(o, x) for x in xin):
                raise Rejected("output_aliases_input", f"output {k} shares memory with an input (trial {i})")
            if any(overlaps(o, e) for e in prev + refs_here):
                raise Rejected("output_aliases_earlier_output",
                               f"output {k} shares memory with an earlier output or a reference output (trial {i})")
            if _has_poison(o, tr["ref"][k]):
                raise Rejected("stale_memory", f"output {k} holds poisoned freed memory the candidate never wrote "
                                               f"(trial {i}): it returns uninitialised memory")
        # bit for bit against the kept copy where there is one; large inputs (regenerated, not kept) by
        # fingerprint, which a change crafted to keep both weighted sums would pass
        changed = modified_inputs(tr.kept, xin) if tr.kept is not None else \
            [j for j, (a, b) in enumerate(zip(tr.prints, _fingerprint(xin), strict=False)) if a != b]
        if changed:
            raise Rejected("inputs_modified", f"the candidate modified input(s) {changed} (trial {i})")
        del xin
        atol = state["atol"] * (LARGE_SCALE if tr["dist"] == "large" else 1.0)
        info = {"trial": i, "distribution": tr["dist"], "atol": atol}
        for k, (ref, o) in enumerate(zip(tr["ref"], outs, strict=False)):
            c = _compare_trial(state, tr, k, ref, o, atol)
            max_abs, max_rel = max(max_abs, c["max_abs_err"]), max(max_rel, c["max_rel_err"])
            r["max_abs_err"], r["max_rel_err"] = max_abs, max_rel
            info.update({f"out{k}_{key}": c[key] for key in ("max_abs_err", "max_rel_err", "rel_norm") if key in c})
            if "fp64" in c:
                info[f"out{k}_fp64"] = c["fp64"]
            if not c["ok"]:
                per_trial.append(info)
                mine = _fingerprint([o])[0]
                if any(len(p) > k and p[k] == mine for p in prev_prints):
                    raise Rejected("cached_result", f"trial {i} ({tr['dist']}) returned the output of an earlier "
                                                    "trial: results are cached across calls")
                extra = {key: c[key] for key in ("first_bad", "first_bad_values", "mismatched", "total") if key in c}
                raise Incorrect(c["error_class"], f"trial {i} ({tr['dist']} inputs), output {k}: {c['message']}",
                                failed_trial=i, **extra)
        per_trial.append(info)
        prev_prints.append(_fingerprint(outs))
        prev = list(outs)
        del outs
        if dev.type == "cuda":
            _sync(dev)
        w.record_spans(None)
        windows.extend(spans)
        w.unread()
    null = judge_null(state["null"], state["atol"], state["rtol"], per_trial)
    if null:  # the problem's fault, not the candidate's: judged when the candidate passed every trial
        raise _ProblemFault(f"{job.problem.label}: {null} (instance: {d.get('instance', {}).get('text')})")
    state["forward_s"] = forward_s
    state["launches"] = w.counter.launches
    state["launch_s"] = w.counter.seconds


def vouch(ref: torch.Tensor, c: dict, want: Any, what: str) -> None:
    """The reference output a comparison read (``c["ref_sums"]``) must be the one computed before the candidate
    was loaded (its print ``want``): one that changed since (the candidate wrote into it, on the device or on
    the host) would pass a wrong output; rejected."""
    if (tuple(ref.shape), str(ref.dtype), *c["ref_sums"]) != tuple(want):
        raise Rejected("reference_modified", f"the reference {what} changed after the candidate was loaded: "
                                             "the candidate wrote into memory that is not its own")


def _compare_trial(state: dict, tr: _Trial, k: int, ref: torch.Tensor, out: torch.Tensor, atol: float) -> dict:
    """``compare`` of output ``k`` of trial ``tr``; a mismatch on a synthetic distribution is judged
    once more against the fp64 reference (``_anchor``), whose verdict then decides (``c["fp64"]``)."""
    c = compare(ref, out, atol, state["rtol"], sums=True)
    vouch(ref, c, tr.out_prints[k], f"output {k} of trial {tr.index}")
    if not c["ok"] and c["error_class"] == "mismatch" and tr["dist"] != "problem":
        a = _anchor(state, tr, k, ref, out, atol)
        if a is not None:
            c["fp64"], c["ok"] = a, a["ok"]
    return c


def _anchor(state: dict, tr: _Trial, k: int, ref: torch.Tensor, out: torch.Tensor, atol: float) -> dict | None:
    """``anchored`` for output ``k`` of a synthetic-distribution trial (the fp64 reference is computed
    once per trial, from a float64 copy of the reference model); ``{"ok": False, "unavailable": why}`` when
    the model cannot run in float64, None when it has no output ``k`` there. An out-of-memory is raised, as our
    own allocation's (``infra:oom``: retried with more memory); read as "cannot run in float64", it left the
    plain comparison to reject KernelBench's 69 and 71 on `mixed` (their jobs capped near 10 GB, the fp64
    copy needing 3.3 GB more)."""
    if not ref.is_floating_point():
        return None
    cache, key = state.setdefault("ref64", {}), tr.index
    if key not in cache:  # one trial's fp64 outputs at a time
        import copy

        cache.clear()
        try:
            m64 = copy.deepcopy(state["ref_model"]).double()
            x64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in tr["inputs"]]
            _reseed(key)
            with torch.no_grad():
                cache[key] = [t.detach() for t in output_tensors(m64(*x64)) or []]
            del m64, x64
        except Exception as exc:  # a model that cannot run in float64: the plain comparison stands
            if is_oom(exc):
                raise
            cache[key] = f"{type(exc).__name__}: {exc}"[:300]
    ref64 = cache[key]
    if isinstance(ref64, str):
        return {"ok": False, "unavailable": ref64}
    if len(ref64) <= k:
        return None
    return anchored(ref64[k], ref, out, atol, state["rtol"])


def _follow(w: Any, state: dict, model: Any, d: dict) -> None:
    """Outputs must follow new inputs written into the *same* tensors (a cache keyed by the tensor's
    identity or address would return the old result)."""
    trials = state["trials"]
    if len(trials) < 2:
        return
    xin = clone_all(trials[0]["inputs"])
    _call(state, model, xin)
    for x, new in zip(xin, trials[1]["inputs"], strict=False):
        if isinstance(x, torch.Tensor):
            x.copy_(new)
    out = output_tensors(_call(state, model, xin, trial=1))
    _sync(w.device)
    _integrity(state, "after timing")
    atol = state["atol"] * (LARGE_SCALE if trials[1]["dist"] == "large" else 1.0)
    for k, (ref, o) in enumerate(zip(trials[1]["ref"], out or [], strict=False)):
        if not _compare_trial(state, trials[1], k, ref, o, atol)["ok"]:
            stale = compare(trials[0]["ref"][k], o, state["atol"], state["rtol"])["ok"]
            if stale:
                raise Rejected("cached_result", "new values written into the same input tensors gave the old "
                                                "output: results are cached across calls")
            raise Incorrect("mismatch", "a second call on the same input tensors with new values gave a wrong output")
    d["follow_check"] = "passed"
