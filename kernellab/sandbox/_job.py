"""One evaluation inside a worker: reference first, then the candidate, checks, timing, kernel share.

Order matters for honesty: the reference model, every trial's inputs and every reference output
(and the torch.compile baseline) are computed *before* the candidate's module is executed, so a
candidate that patches torch cannot change what it is compared with; the reference outputs stay
alive while the candidate runs, and freed memory is poisoned before each candidate call.

Memory: one trial at a time on the device. Reference outputs are kept on the CPU (compared chunk by
chunk on the device) and a trial's inputs are regenerated from their seeds when needed, checked
against the fingerprint taken when the reference ran (so what the candidate gets is what the
reference got). An out-of-memory outside the candidate's own code is an infrastructure failure
(``crash``, ``infra:oom``, ``details.infra``), never the candidate's verdict.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

import torch

from kernellab.problem import apply_mode, output_tensors
from kernellab.small import instance_sizes
from kernellab.vocab import SEED, ConfigError, apply_config, share_wins

from ._check import (
    DISTRIBUTIONS,
    LARGE_SCALE,
    anchored,
    check_structure,
    clone_all,
    compare,
    distribution,
    judge_null,
    modified_inputs,
    null_constants,
    null_verdict,
    overlaps,
    transform,
    trial_atol,
)
from ._gpu import FP_CHUNK, POISON_CAP
from ._guard import ForwardWatch, StateSnapshot, _reference_classes
from ._result import (
    Incorrect,
    Rejected,
    classify,
    empty_result,
    format_exc,
    is_oom,
    reference_key,
    truncate,
)
from ._timing import _Event, _sleep, side_stream_leftover, spin_cycles, time_cpu, time_gpu

# A poison word no arithmetic produces: a *signalling* NaN in fp32 (its upper half, 0x7FBA, is a
# signalling NaN in fp16 and bf16 too). Computed NaNs are quiet, so finding it in an output means
# the candidate returned memory it never wrote.
POISON32 = 0x7FBADBAD
POISON16 = 0x7FBA
# side-stream work: leftover device time after the end event beyond this (ms, or share of the event time)
LEFTOVER_MS, LEFTOVER_SHARE = 0.1, 0.5
# the busy check (_busy_check): an honest call's busy time is at most its event time; the margin covers the
# two clocks' resolution. The spin kernel before each profiled call: 3x the fastest call, within these bounds.
BUSY_FACTOR, BUSY_MARGIN_MS = 1.25, 0.05
SPIN_MIN_MS, SPIN_MAX_MS = 2.0, 50.0
# Timing writes fresh inputs before every repetition, and moves them to the other of two tensor
# sets every this many repetitions (new addresses as well as new values).
FRESH_EVERY = 4
# The mix of the last timed repetition (its reference is computed with the trials'): a band of its own
# between the two bands of the other repetitions (see _Fresh), so no earlier output is close to its own.
FINAL_MIX = 0.5
MIX_BANDS = ((0.1, 0.35), (0.65, 0.9))
_RESTART = {"timeout", "crash", "rejected"}


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


def _fingerprint(xs: list, device: torch.device | None = None) -> list:
    """Per input: shape, dtype and two position-weighted sums of its bits (computed where the tensor
    lives, or on ``device``, chunk by chunk), or the value itself when not a tensor. Equal inputs give
    equal prints, wherever they are computed (integer sums)."""
    out: list = []
    for x in xs:
        if not isinstance(x, torch.Tensor):
            out.append(repr(x))
            continue
        t = x.detach().contiguous().reshape(-1)
        word = _WORD.get(t.element_size())
        bits = t.view(word) if word is not None and t.dtype != torch.bool else t.to(torch.int64)
        s1 = s2 = 0
        for lo in range(0, t.numel(), FP_CHUNK):
            b = bits[lo:lo + FP_CHUNK].to(device or bits.device).to(torch.int64)
            w = torch.arange(lo, lo + b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
            s1 += int(b.sum())
            s2 += int((b * w).sum())
        out.append((tuple(x.shape), str(x.dtype), str(x.stride()), s1, s2))
    return out




def _value_prints(xs: list, device: torch.device | None = None) -> list:
    """The prints of :func:`_fingerprint` without the strides: a copy to the host keeps the values, not
    always the layout (an expanded output comes back contiguous)."""
    return [p[:2] + p[3:] if isinstance(p, tuple) else p for p in _fingerprint(xs, device)]


# A trial's inputs up to this size stay alive for the whole job (a read returns a fresh copy):
# cheaper than regenerating them, and the memory does not matter. Larger ones are regenerated.
KEEP_INPUTS_BYTES = int(float(os.environ.get("KERNELLAB_SANDBOX_KEEP_INPUTS_BYTES", 16 << 20)))


class _Trial:
    """One correctness trial. Read like the dict it used to be (``tr["dist"]``, ``tr["ref"]``,
    ``tr["inputs"]``): ``ref`` are the reference outputs (on the CPU for a GPU worker), and each read
    of ``inputs`` gives fresh tensors: a copy of small inputs kept since the reference ran, or large
    ones regenerated on the device from the trial's seeds, so that at most one trial's large inputs
    are alive at a time."""

    def __init__(self, index: int, dist: str, make: Any, ref: list[torch.Tensor], prints: list,
                 kept: list | None = None) -> None:
        self.index, self.dist, self.ref, self.prints, self._make = index, dist, ref, prints, make
        self.kept = kept

    def inputs(self) -> list:
        if self.kept is not None:
            return clone_all(self.kept)
        x = self._make(self.index)
        if _fingerprint(x) != self.prints:
            raise _ProblemFault(f"trial {self.index}: get_inputs gave other inputs under the same seed than "
                                "when the reference ran (the problem's inputs must be reproducible from torch's seed)")
        return x

    def __getitem__(self, key: str) -> Any:
        if key == "inputs":
            return self.inputs()
        if key == "dist":
            return self.dist
        if key == "ref":
            return self.ref
        raise KeyError(key)


# On the CPU torch allocates through glibc malloc, whose reuse of freed blocks _poison cannot steer
# (about one run in ten handed the candidate a block it had not poisoned). There the candidate runs
# with torch's deterministic mode on (warnings only), which fills every tensor torch.empty returns
# with a *positive* quiet NaN; NaNs computed on x86 are negative (0xFFC00000), so an output made
# only of that NaN where the reference has numbers is memory the candidate never wrote.
_FILL_NAN = {torch.float64: 0x7FF8000000000000, torch.float32: 0x7FC00000, torch.float16: 0x7E00,
             torch.bfloat16: 0x7FC0}
_WORD = {8: torch.int64, 4: torch.int32, 2: torch.int16}


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


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def run_job(w: Any, job: dict) -> tuple[dict, bool]:
    r = empty_result(job.get("config"))
    d = r["details"]
    r["device"] = w.info["device"]
    r["versions"] = w.info["versions"]
    r["interpreted"] = w.device_kind != "cuda"
    jobdir = Path(tempfile.mkdtemp(prefix=f"job{w.jobs}-", dir=w.home))
    os.chdir(jobdir)
    names: list[str] = []
    phase = "load"
    restart = False
    state: dict[str, Any] = {}
    mem = d.setdefault("memory", {})
    try:
        phase = "reference"
        w.limit_gpu_memory(job.get("gpu_grant_bytes"))
        w.read()
        w.phase("reference")
        _reference(w, job, state, d)
        d["instance"] = instance_sizes(job["problem"], job["small"])
        if w.device_kind == "cuda":
            mem["reference_peak_bytes"] = torch.cuda.max_memory_allocated(w.device)
            w.send("peak", mem["reference_peak_bytes"])  # the jobs waiting for this problem's probe go now
        if job.get("need_baseline") and w.device_kind == "cuda" and job.get("timing", True):
            w.phase("baseline")
            d["baseline_measured"] = _baseline(w, state)
        elif job.get("time_compile") and w.device_kind == "cuda" and job.get("timing", True):
            w.phase("baseline")
            _compile_reference(w, state, d)
        if job.get("prepare_only"):  # the reference and the baseline were the point: no candidate
            raise _Prepared()
        phase = "load"
        w.read()  # the baseline's timing gave it up
        w.regrant(job.get("gpu_grant_bytes"), job.get("regrant_floor_bytes"), bool(job.get("time_compile")))
        w.phase("load")
        state["snapshot"] = StateSnapshot()
        name = f"kernellab_candidate_{job['job_id']}"
        names.append(name)
        from ._load import load_module

        mod = load_module(job["source"], jobdir, name)
        if w.device_kind == "cuda":  # an Inductor-generated candidate's launches (the interpreter counts them already)
            w.counter.hook_inductor()
        _apply_config(mod, job.get("config"))
        cls = getattr(mod, "ModelNew", None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise _LoadError("missing_modelnew", "the candidate defines no class ModelNew(torch.nn.Module)")
        torch.manual_seed(SEED)
        model = apply_mode(cls(*state["init"]).to(device=w.device, dtype=state["dtype"]), state["mode"])
        state["watch"] = ForwardWatch(_reference_classes(state["ref_mod"], mod, extra=(cls,)))
        phase = "compile"
        w.phase("compile")
        _trials(w, job, state, model, d, r, first_phase_done=lambda: w.phase("check"))
        phase = "check"
        if job.get("timing", True):
            phase = "timing"
            w.read()  # the timing's input copies are made before it takes the writer lock
            _timing(w, job, state, model, d, r)
        phase = "check"
        w.read()  # the timing held the writer lock and released it
        w.phase("follow")
        _follow(w, state, model, d)
        if not state.get("shared_measured"):  # on a GPU the timing measured it already, under its lock
            w.phase("kernel_share")
            _kernel_share(w, state, model, d, r)
        r["status"] = "correct"
    except _Prepared:
        r["status"] = "correct"
        d["prepared"] = True
    except _LoadError as exc:
        r.update(status="compile_error", error_class=exc.error_class, error_text=str(exc))
    except Rejected as exc:
        r.update(status="rejected", error_class=f"integrity:{exc.reason}", error_text=str(exc))
        d.setdefault("integrity", []).append({"reason": exc.reason, "message": str(exc), **exc.details})
    except Incorrect as exc:
        r.update(status="incorrect", error_class=exc.error_class, error_text=str(exc))
        d.update(exc.details)
    except _ProblemFault as exc:
        r.update(status="runtime_error", error_class="problem", error_text=str(exc))
    except _InfraFault as exc:
        r.update(status="crash", error_class=f"infra:{exc.kind}", error_text=str(exc))
        d.update(infra=True, phase=phase)
        restart = True
    except BaseException as exc:  # candidate code may raise anything, SystemExit included
        if is_oom(exc) and not _in_candidate(exc, str(jobdir / f"{names[0]}.py") if names else None):
            # our own allocation (poison, a comparison, an input copy) did not fit: not the candidate's doing
            r.update(status="crash", error_class="infra:oom",
                     error_text=format_exc(exc) + f"\n(out of memory outside the candidate's code, {phase} phase)")
            d.update(infra=True, phase=phase)
            restart = True
        else:
            status, cls_, must_restart = classify(exc, phase)
            r.update(status=status, error_class=cls_, error_text=format_exc(exc))
            restart = restart or must_restart
            d["phase"] = phase
    finally:
        if state.get("locked"):
            w.unlock()
        if w.device_kind == "cuda":
            try:
                mem["peak_bytes"] = torch.cuda.max_memory_allocated(w.device)
            except BaseException:
                restart = True
        if "watch" in state:
            state["watch"].close()
        w.counter.armed = False
        state.clear()
        cleanup_dir = jobdir
        from ._load import cleanup

        cleanup(cleanup_dir, w.home, names)
        if w.device_kind == "cuda":
            try:
                torch.cuda.empty_cache()
            except BaseException:
                restart = True
        w.unread()  # after the job's last GPU work, freeing included
    restart = restart or r["status"] in _RESTART or w.jobs >= int(job.get("max_jobs", 50))
    if r["error_text"]:
        r["error_text"] = truncate(r["error_text"])
    return r, restart


class _Prepared(Exception):
    """A ``prepare`` job is done once its reference (and baseline) ran."""


class _LoadError(Exception):
    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


class _ProblemFault(Exception):
    """The problem itself failed in the worker (not the candidate's fault)."""


class _InfraFault(Exception):
    """Our own machinery failed (e.g. out of memory building the reference): ``infra:<kind>``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _in_candidate(exc: BaseException, path: str | None) -> bool:
    """Whether ``exc`` was raised inside the candidate's module (a frame of its file)."""
    if not path:
        return False
    return any(f.f_code.co_filename == path for f, _ in traceback.walk_tb(exc.__traceback__))


def _apply_config(mod: Any, config: dict | None) -> None:
    try:
        apply_config(getattr(mod, "CONFIG", None), config, getattr(mod, "SPACE", None))
    except ConfigError as exc:
        raise _LoadError("config", str(exc)) from None


def _reference(w: Any, job: dict, state: dict, d: dict) -> None:
    """Build the reference model and every trial's reference outputs, or take the outputs from the
    worker's cache (:class:`_References`) when this job allows it (``reuse_reference``; never for a
    re-timing, whose printed number comes from outputs computed in its own job) and the executor
    vouches for them (``ref_digest``: what this worker reported when it computed them, before any
    candidate of that job ran). Between trials the GPU's shared hold is given up and asked for again,
    so a timing waiting for the GPU waits for one trial, not for the whole reference."""
    from kernellab.problem import instantiate, make_inputs

    problem, small, dev = job["problem"], job["small"], w.device
    n = max(1, int(job.get("trials", 5)))
    timing_on = bool(job.get("timing", True))
    key = reference_key(problem.id, bool(small), n, timing_on)
    cache = _references(w)
    info = d.setdefault("reference", {"key": key})
    t_ref = time.perf_counter()
    entry = cache.take(key, job.get("ref_digest")) if job.get("reuse_reference", True) else None
    try:
        inst = instantiate(problem, small=small, seed=SEED, device=dev)
        settings = problem.settings(inst.module)
        mod = inst.module
        inst.inputs = []  # instantiate's own sample: the trials make theirs, one at a time

        def make(t: int) -> list:
            base = make_inputs(mod, inst.dtype, dev, SEED + 1 + t)
            # the synthetic distributions' draws on the device too (seconds each on the host at full size)
            gen = torch.Generator(device=dev).manual_seed(SEED + 1000 + t)
            return transform(base, distribution(t), gen)

        if entry is not None and not entry.intact(dev):
            # changed since it was computed (a candidate of an earlier job reached it): computed anew
            info["cache_changed"] = True
            cache.drop(key)
            entry = None
        trials = []
        # where the reference's time goes (``reference.parts_s``), the device synchronised at each boundary:
        # at KernelBench's level-1 sizes it took 27-31 s of a 45 s evaluation on the H200
        parts: dict[str, float] = {}
        clock = [time.perf_counter()]

        def lap(name: str) -> None:
            _sync(dev)
            now = time.perf_counter()
            parts[name] = parts.get(name, 0.0) + now - clock[0]
            clock[0] = now

        # the outputs' prints where they are computed (on the device: cheap), while they may still be cached
        cap = int(job.get("ref_cache_bytes") or 0) if job.get("reuse_reference", True) else 0
        ref_prints: list | None = [] if entry is None and cap > 0 else None
        held = 0

        atol, rtol = settings["atol"], settings["rtol"]
        # A job of fewer trials than distributions (a tuning trial's two) whose trials a null output would all
        # pass gets more, up to one of each distribution, until one would not: KernelBench's level2/9 at its
        # own size is all zeros on its first two (ReLU of a shifted GEMM), informative on the third, and
        # its tuning trials were refused as the problem's fault while its 5-trial evaluations judged fine.
        limit = max(n, len(DISTRIBUTIONS))
        atols = [trial_atol(atol, distribution(t)) for t in range(limit)]
        nulls: list[str | None] = list(entry.nulls) if entry is not None else []
        consts: list[float] = []

        def judged(t: int, outs: list[torch.Tensor]) -> None:
            # whether a null output would pass this trial: a property of the reference alone, judged where
            # it was computed (on the device), once per problem when the outputs are reused
            if t == 0:
                consts.extend(null_constants(outs, max(atols[:n]), rtol))
            nulls.append(null_verdict(outs, atols[t], rtol, consts))

        def computed(outs: list[torch.Tensor]) -> list[torch.Tensor]:
            nonlocal ref_prints, held
            held += sum(t_.numel() * t_.element_size() for t_ in outs)
            if ref_prints is not None and held <= cap:
                ref_prints.append(_value_prints(outs))
            else:
                ref_prints = None
            # on the CPU, not next to the candidate's trial: one trial at a time on the device
            return [t_.detach().to("cpu") for t_ in outs]

        def more(t: int) -> bool:
            if entry is not None:
                return t < len(entry.refs)
            return t < n or (t < limit and all(v is not None for v in nulls))

        t = 0
        while more(t):
            if t:  # a preemption point: a timing waiting for the GPU goes first
                _sync(dev)
                w.unread()
                w.read()
            clock[0] = time.perf_counter()
            x = make(t)
            lap("inputs")
            prints = _fingerprint(x)
            lap("fingerprint")
            if entry is not None:
                if prints != entry.input_prints[t]:
                    raise _ProblemFault(f"trial {t}: get_inputs gave other inputs under the same seed than when the "
                                        "reference ran (the problem's inputs must be reproducible from torch's seed)")
                ref = entry.refs[t]
            else:
                with torch.no_grad():
                    _reseed(t)
                    ref = output_tensors(inst.model(*clone_all(x)))
                lap("forward")
                if ref is None:
                    raise _ProblemFault(f"{problem.label}: Model.forward returned no tensors")
                judged(t, ref)
                lap("null_check")
                ref = computed(ref)
                lap("to_host")
            size = sum(v.numel() * v.element_size() for v in x if isinstance(v, torch.Tensor))
            trials.append(_Trial(t, distribution(t), make, ref, prints, kept=x if size <= KEEP_INPUTS_BYTES else None))
            del x
            t += 1
        if len(trials) > n:
            info["extra_trials"] = len(trials) - n
        timing = None
        if timing_on:
            # a second sample of the problem's inputs, which timing mixes with trial 0's (see _Fresh),
            # and the reference output for the last timed repetition's mix
            base = make_inputs(mod, inst.dtype, dev, SEED + 500)
            if entry is not None:
                final_ref = entry.final_ref
            else:
                final = _Fresh.mix(trials[0]["inputs"], base, FINAL_MIX)
                with torch.no_grad():
                    _reseed(_FINAL_TRIAL)
                    final_ref = computed(output_tensors(inst.model(*clone_all(final))) or [])
            timing = {"base": base, "final_ref": final_ref}
        _sync(dev)
        if ref_prints is not None:
            made = cache.put(key, [tr.ref for tr in trials], timing["final_ref"] if timing else None,
                             [tr.prints for tr in trials], ref_prints, cap, nulls)
            if made is not None:
                w.send("reference", key, made.digest)  # before any candidate runs: the executor vouches for it
    except (_ProblemFault, _InfraFault):
        raise
    except Exception as exc:
        msg = f"{problem.label}: the reference failed in the worker: {type(exc).__name__}: {exc}"
        if is_oom(exc):
            raise _InfraFault("oom", msg) from exc
        raise _ProblemFault(msg) from exc
    info.update(reused=entry is not None, s=round(time.perf_counter() - t_ref, 3),
                parts_s={k: round(v, 3) for k, v in parts.items()})
    state.update(ref_mod=mod, ref_model=inst.model, init=inst.init_inputs, dtype=inst.dtype, null=nulls,
                 atol=settings["atol"], rtol=settings["rtol"], trials=trials, mode=settings["mode"], timing=timing)
    d["tolerance"] = {"atol": settings["atol"], "rtol": settings["rtol"], "dtype": settings["dtype"]}
    d["mode"] = settings["mode"]
    d["small"] = bool(small)


class _Cached:
    """One problem's reference outputs (on the host), the prints of the inputs they were computed from,
    and the prints of the outputs taken where they were computed (``digest``: their hash)."""

    def __init__(self, refs: list, final_ref: list | None, input_prints: list, ref_prints: list,
                 nulls: list | None = None) -> None:
        from kernellab.problem import content_hash

        self.refs, self.final_ref, self.input_prints, self.ref_prints = refs, final_ref, input_prints, ref_prints
        self.nulls = list(nulls or [])
        self.digest = content_hash(repr((input_prints, ref_prints, self.nulls)))
        self.nbytes = sum(t.numel() * t.element_size() for ts in refs + [final_ref or []] for t in ts)

    def intact(self, dev: torch.device) -> bool:
        """Whether the outputs still have the prints they were computed with (fingerprinted on ``dev``)."""
        outs = self.refs + ([self.final_ref] if self.final_ref is not None else [])
        return [_value_prints(ts, dev) for ts in outs] == self.ref_prints


class _References:
    """The worker's reference outputs by :func:`reference_key`, least recently used first out, at most
    ``cap`` bytes on the host (the executor's share of the host's memory for this worker). The
    reference of a problem is the same in every job of it (the same seeds, inputs checked by their
    prints), so the forward passes and device-to-host copies are paid once per worker, not per job."""

    def __init__(self) -> None:
        import collections

        self._entries: collections.OrderedDict[str, _Cached] = collections.OrderedDict()

    def take(self, key: str, digest: str | None) -> _Cached | None:
        entry = self._entries.get(key)
        if entry is None or digest is None or entry.digest != digest:
            return None
        self._entries.move_to_end(key)
        return entry

    def drop(self, key: str) -> None:
        self._entries.pop(key, None)

    def put(self, key: str, refs: list, final_ref: list | None, input_prints: list, ref_prints: list,
            cap: int, nulls: list | None = None) -> _Cached | None:
        entry = _Cached(refs, final_ref, input_prints, ref_prints, nulls)
        self._entries.pop(key, None)
        if entry.nbytes > cap:
            return None
        while self._entries and self.nbytes + entry.nbytes > cap:
            self._entries.popitem(last=False)
        self._entries[key] = entry
        return entry

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())


def _references(w: Any) -> _References:
    cache = getattr(w, "references", None)
    if cache is None:
        cache = w.references = _References()
    return cache


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


_FINAL_TRIAL = -1  # the seed of the last timed repetition, whose output is checked


def _reseed(trial: int) -> None:
    """The global RNG right before a checked forward: the same state for the reference's call and
    the candidate's call of one trial, so a forward that draws random numbers (dropout in training
    mode) draws the same ones in both -- when it draws them the way the reference does (torch's
    own dropout); a kernel with its own generator cannot match and is judged incorrect."""
    torch.manual_seed(SEED + 500 + trial)


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


def _trials(w: Any, job: dict, state: dict, model: Any, d: dict, r: dict, first_phase_done: Any) -> None:
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
    cap = int(job.get("poison_cap") or POISON_CAP)
    windows = d.setdefault("trial_windows", []) if dev.type == "cuda" else []
    for i, tr in enumerate(state["trials"]):
        w.read()
        t_read = time.time()  # wall clock, to show that no trial overlaps another job's timing
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
            windows.append((t_read, time.time()))
        w.unread()
    null = judge_null(state["null"], state["atol"], state["rtol"], per_trial)
    if null:  # the problem's fault, not the candidate's: judged when the candidate passed every trial
        raise _ProblemFault(f"{job['problem'].label}: {null} (instance: {d.get('instance', {}).get('text')})")
    state["forward_s"] = forward_s
    state["launches"] = w.counter.launches
    state["launch_s"] = w.counter.seconds


def _compare_trial(state: dict, tr: _Trial, k: int, ref: torch.Tensor, out: torch.Tensor, atol: float) -> dict:
    """``compare`` of output ``k`` of trial ``tr``; a mismatch on a synthetic distribution is judged
    once more against the fp64 reference (``_anchor``), whose verdict then decides (``c["fp64"]``)."""
    c = compare(ref, out, atol, state["rtol"])
    if not c["ok"] and c["error_class"] == "mismatch" and tr["dist"] != "problem":
        a = _anchor(state, tr, k, ref, out, atol)
        if a is not None:
            c["fp64"], c["ok"] = a, a["ok"]
    return c


def _anchor(state: dict, tr: _Trial, k: int, ref: torch.Tensor, out: torch.Tensor, atol: float) -> dict | None:
    """``anchored`` for output ``k`` of a synthetic-distribution trial (the fp64 reference is computed
    once per trial, from a float64 copy of the reference model); None when fp64 cannot be had."""
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
        except Exception:  # a model that cannot run in float64: the plain comparison stands
            cache[key] = []
    ref64 = cache[key]
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


class _Fresh:
    """The inputs of one timed callable, rewritten before each repetition (outside the timed region).

    Each repetition gets a convex mix ``a + c (b - a)`` of two samples of the problem's own inputs
    (trial 0's and a second one), with a new random ``c``: a mix keeps whatever a problem's inputs
    share that is convex (signs, ranges, triangular or symmetric matrices, probability rows), yet no
    two repetitions see the same values, so nothing keyed on the inputs (address, version, values)
    can hand back an earlier result. ``c`` alternates between the two MIX_BANDS, and the last
    repetition gets FINAL_MIX, between them: an output left over from any earlier repetition, or from
    the unmixed inputs of the trials, is far from the last one's, whose reference was computed before
    the candidate was loaded. Every FRESH_EVERY repetitions the values go to the other of two tensor
    sets. Non-float inputs (indices, masks) alternate between the two samples."""

    def __init__(self, a: list, b: list, seed: int) -> None:
        self.a, self.b = a, b
        self.sets = [clone_all(a), clone_all(a)]
        self.current = self.sets[0]
        self.rng = random.Random(seed)
        self.n = 0
        self.last = False

    @staticmethod
    def mix(a: list, b: list, c: float, out: list | None = None, n: int = 0) -> list:
        out = clone_all(a) if out is None else out
        for a_, b_, x in zip(a, b, out, strict=False):
            if not isinstance(x, torch.Tensor):
                continue
            if (x.is_floating_point() or x.is_complex()) and a_.shape == b_.shape == x.shape:
                torch.lerp(a_, b_, c, out=x)
            else:
                x.copy_(b_ if n % 2 and b_.shape == x.shape else a_)
        return out

    def __call__(self, last: bool = False, same_tensors: bool = False) -> None:
        if not same_tensors:
            self.current = self.sets[(self.n // FRESH_EVERY) % 2]
        c = FINAL_MIX if last else self.rng.uniform(*MIX_BANDS[self.n % 2])
        self.n += 1
        self.last = last
        # the last mix's non-float inputs are those _reference gave its reference: the first sample's
        self.mix(self.a, self.b, c, self.current, 0 if last else self.n)


def _timing(w: Any, job: dict, state: dict, model: Any, d: dict, r: dict) -> None:
    """Time the candidate against eager, on fresh inputs before each repetition (see _Fresh), then
    check the last timed output; ``job``'s ``timing_target_ms`` (a cheaper timing) and
    ``stop_above_ms`` (early stop on the first repetitions' median) go to the timing functions."""
    x = state["trials"][0]["inputs"]
    # the same sequence of values for both: the eager reference gets the very inputs the candidate gets
    fc, fr = _Fresh(x, state["timing"]["base"], SEED + 7), _Fresh(x, state["timing"]["base"], SEED + 7)
    ref_model = state["ref_model"]
    watch = state["watch"]
    target_ms, stop_above = job.get("timing_target_ms"), job.get("stop_above_ms")
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
            w.phase("timing")
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
            w.phase("kernel_share")
            # (on the timing's own inputs: a clone would be a seventh copy the memory grant does not count)
            _kernel_share(w, state, model, d, r, call_ms=t["candidate"]["estimate_ms"], inputs=fc.current,
                          integrity=False)  # _integrity(state, "timing") below, once grad mode is back
            state["shared_measured"] = True
            w.unlock()
            state["locked"] = False
        else:
            w.phase("timing")
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
    ref = state["timing"]["final_ref"]
    atol, rtol = state["atol"], state["rtol"]

    def wrong(o: Any) -> str | None:
        bad = check_structure(ref, o, device=w.device)
        if bad:
            return bad[1]
        for k, (rf, ot) in enumerate(zip(ref, output_tensors(o), strict=False)):
            c = compare(rf, ot, atol, rtol)
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
