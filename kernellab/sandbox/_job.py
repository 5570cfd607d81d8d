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

The job's steps live in modules of their own, in the order they run: ``_reference`` (the reference's inputs and
outputs, their cache), ``_trials`` (the candidate's correctness trials and integrity checks) and ``_measure``
(baseline, timing, kernel share). This module holds :func:`run_job`, which runs them and turns what they
raise into the result's status.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from pathlib import Path
from typing import Any

import torch

from kernellab.problem import apply_mode
from kernellab.small import instance_sizes
from kernellab.vocab import SEED, ConfigError, apply_config

from ._guard import ForwardWatch, StateSnapshot, _reference_classes
from ._measure import _baseline, _compile_reference, _kernel_share, _timing
from ._protocol import JobSpec, Msg, Phase
from ._reference import _InfraFault, _ProblemFault, _reference
from ._result import (
    Incorrect,
    Rejected,
    classify,
    empty_result,
    format_exc,
    is_oom,
    truncate,
)
from ._trials import _follow, _trials

_RESTART = {"timeout", "crash", "rejected"}


def run_job(w: Any, job: JobSpec) -> tuple[dict, bool]:
    r = empty_result(job.config)
    d = r["details"]
    r["device"] = w.info["device"]
    r["versions"] = w.info["versions"]
    r["interpreted"] = w.device_kind != "cuda"
    jobdir = Path(tempfile.mkdtemp(prefix=f"job{w.jobs}-", dir=w.home))
    os.chdir(jobdir)
    names: list[str] = []
    phase = Phase.LOAD
    restart = False
    state: dict[str, Any] = {}
    mem = d.setdefault("memory", {})
    try:
        phase = Phase.REFERENCE
        w.limit_gpu_memory(job.gpu_grant_bytes)
        w.refs_on_device = 0
        w.read()
        w.phase(Phase.REFERENCE)
        _reference(w, job, state, d)
        d["instance"] = instance_sizes(job.problem, job.small)
        if w.device_kind == "cuda":
            mem["reference_peak_bytes"] = torch.cuda.max_memory_allocated(w.device)
            w.send(Msg.PEAK, w.need_peak())  # the jobs waiting for this problem's probe go now
        if job.need_baseline and w.device_kind == "cuda" and job.timing:
            w.phase(Phase.BASELINE)
            d["baseline_measured"] = _baseline(w, state)
        elif job.time_compile and w.device_kind == "cuda" and job.timing:
            w.phase(Phase.BASELINE)
            _compile_reference(w, state, d)
        if job.prepare_only:  # the reference and the baseline were the point: no candidate
            raise _Prepared()
        phase = Phase.LOAD
        w.read()  # the baseline's timing gave it up
        w.regrant(job.gpu_grant_bytes, job.regrant_floor_bytes, bool(job.time_compile), job.side_bytes)
        w.phase(Phase.LOAD)
        state["snapshot"] = StateSnapshot()
        name = f"kernellab_candidate_{job.job_id}"
        names.append(name)
        from ._load import load_module

        mod = load_module(job.source, jobdir, name)
        if w.device_kind == "cuda":  # an Inductor-generated candidate's launches (the interpreter counts them already)
            w.counter.hook_inductor()
        _apply_config(mod, job.config)
        cls = getattr(mod, "ModelNew", None)
        if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
            raise _LoadError("missing_modelnew", "the candidate defines no class ModelNew(torch.nn.Module)")
        torch.manual_seed(SEED)
        model = apply_mode(cls(*state["init"]).to(device=w.device, dtype=state["dtype"]), state["mode"])
        state["watch"] = ForwardWatch(_reference_classes(state["ref_mod"], mod, extra=(cls,)))
        phase = Phase.COMPILE
        w.phase(Phase.COMPILE)
        _trials(w, job, state, model, d, r, first_phase_done=lambda: w.phase(Phase.CHECK))
        phase = Phase.CHECK
        if job.timing:
            phase = Phase.TIMING
            w.read()  # the timing's input copies are made before it takes the writer lock
            _timing(w, job, state, model, d, r)
        phase = Phase.CHECK
        w.read()  # the timing held the writer lock and released it
        w.phase(Phase.FOLLOW)
        _follow(w, state, model, d)
        if not state.get("shared_measured"):  # on a GPU the timing measured it already, under its lock
            w.phase(Phase.KERNEL_SHARE)
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
        d.update(infra=True, phase=str(phase))
        restart = True
    except BaseException as exc:  # candidate code may raise anything, SystemExit included
        if is_oom(exc) and not _in_candidate(exc, str(jobdir / f"{names[0]}.py") if names else None):
            # our own allocation (poison, a comparison, an input copy) did not fit: not the candidate's doing
            r.update(status="crash", error_class="infra:oom",
                     error_text=format_exc(exc) + f"\n(out of memory outside the candidate's code, {phase} phase)")
            d.update(infra=True, phase=str(phase))
            restart = True
        else:
            status, cls_, must_restart = classify(exc, phase)
            r.update(status=status, error_class=cls_, error_text=format_exc(exc))
            restart = restart or must_restart
            d["phase"] = str(phase)  # plain: the result is pickled to the executor and stored
    finally:
        w.record_spans(None)  # a trial that raised left its spans recording
        if state.get("locked"):
            w.unlock()
        if w.device_kind == "cuda":
            try:
                mem["peak_bytes"] = torch.cuda.max_memory_allocated(w.device)
                # what the grant's cap counts (set_per_process_memory_fraction caps the allocator's segments):
                # above peak_bytes by the fragmentation, which may be why a job runs out under its grant
                mem["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(w.device)
            except BaseException:
                restart = True
            if w.refs_on_device:  # on every path: one that ran out beside them is retried (_gpu.retry_admission)
                mem["refs_on_device_bytes"] = w.refs_on_device
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
    restart = restart or r["status"] in _RESTART or w.jobs >= int(job.max_jobs)
    if r["error_text"]:
        r["error_text"] = truncate(r["error_text"])
    return r, restart


class _Prepared(Exception):
    """A ``prepare`` job is done once its reference (and baseline) ran."""


class _LoadError(Exception):
    def __init__(self, error_class: str, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class


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
