"""Memory admission of :class:`~kernellab.sandbox.LocalExecutor`: what a job needs, who probes, the retries.

A job is admitted to its device's byte budget (``_gpu.MemoryBudget``) with the need :meth:`_Admission._need`
gives: the meta device's estimate (with a margin) until a job of the problem has measured its reference's
peak, that peak's need after (:meth:`_note_peak`); a problem's first large job runs as its probe, alone among
its own (:meth:`_probe_turn`, :meth:`_end_probe`); :meth:`_attempts` admits, runs and retries after an
infrastructure failure or a shared out-of-memory (``_gpu.retry_admission``). Apart from the message loop
(``_jobloop``), which only runs one admitted attempt, and from the slots (``_slots``), which only own workers.

The mixin reads the executor's state that ``LocalExecutor.__init__`` sets: ``_lock``, ``_budgets``,
``_estimates``, ``_estimate_errors``, ``_ref_peaks``, ``_side_peaks``, ``_probes``, ``_probed``, ``_oom_needs``, ``_closed``,
``_workers``; it runs an attempt with ``_run`` (``_jobloop``) and restarts a worker with ``_start_worker``
(``_slots``).
"""

from __future__ import annotations

import threading
import time

from kernellab.problem import Problem

from ._api import EvalJob
from ._gpu import (
    OOM_CLASSES,
    MemoryBudget,
    TooBig,
    estimate,
    measured_need,
    need_peak,
    probes,
    retry_admission,
    side_need,
    unmeasured_need,
)
from ._protocol import Phase
from ._result import infra_result, is_infra, truncate
from ._slots import _Worker


class _Admission:
    """Memory admission and retries of :class:`~kernellab.sandbox.LocalExecutor` (see the module docstring)."""

    # -- memory ----------------------------------------------------------------------------------
    def _need(self, problem: Problem, small: bool, compile_timed: bool,
              budget_bytes: int) -> tuple[int | None, int | None]:
        """(bytes a job of ``problem`` needs on its device, the least it can run with); None: unknown
        (an unknown need runs alone). ``compile_timed``: a re-timing, which times torch.compile too;
        ``budget_bytes``: the device's budget, which bounds an unmeasured need (:func:`_gpu.unmeasured_need`)."""
        key = (problem.id, bool(small))
        with self._lock:
            known = key in self._estimates
            est = self._estimates.get(key)
            peak = self._ref_peaks.get(key)
        if not known:
            try:
                est = estimate(problem, bool(small), strict=True)
            except Exception as exc:  # the job then runs alone; its result says why (details.memory)
                est = None
                self._estimate_errors[key] = truncate(f"{type(exc).__name__}: {exc}", 300)
            with self._lock:
                self._estimates[key] = est
        need, floor = est if est else (None, None)
        if need is not None and peak is None:
            # the meta device's estimate misses the reference's activations and the allocator's rounding:
            # gemm_bias_gelu's (1.21 GB) was 0.73x the need its measured peak then gave, and every job of
            # a pool's first wave ran out of its grant. Until a job has measured the peak, more than that.
            need = unmeasured_need(need, budget_bytes)
        with self._lock:
            grown = self._oom_needs.get(key)
        if grown is not None:
            need = max(need or 0, grown)
        if peak is not None:
            need = max(need or 0, measured_need(peak, compile_timed))
            floor = max(floor or 0, peak)
        side = self._measured_side(key, compile_timed)
        if side is not None and need is not None:
            need = max(need, side)  # room for the job's own side with no output kept on the device
        return need, floor

    def _measured_side(self, key: tuple[str, bool], compile_timed: bool) -> int | None:
        """:func:`_gpu.side_need` of the largest side a job of ``key``'s problem (of its kind) measured; None before."""
        with self._lock:
            side = self._side_peaks.get((*key, bool(compile_timed)))
        return side_need(side) if side is not None else None

    def _side_floor(self, problem: Problem, small: bool, compile_timed: bool) -> int | None:
        """What a job of ``problem`` reserves for its own side beside the reference outputs it keeps on the
        device (``JobSpec.side_bytes``): the measured side (:meth:`_measured_side`), else the meta device's
        footprint (its first jobs then keep fewer outputs there, where twice the working peak would have kept six
        of KernelBench's 6.4 GB outputs beside a 51.7 GB side in an 82.3 GB grant)."""
        key = (problem.id, bool(small))
        side = self._measured_side(key, compile_timed)
        if side is not None:
            return side
        with self._lock:
            est = self._estimates.get(key)
        return est[0] if est else None

    def _note_side(self, key: tuple[str, bool, bool], mem: dict, error_class: str) -> None:
        """A finished attempt's own side: its reserved peak less the reference outputs it kept on the device. Not
        from a candidate that ran out of memory itself: what it asked for is its own, not the problem's."""
        reserved = int(mem.get("peak_reserved_bytes") or 0)
        if not reserved or error_class == "oom":
            return
        side = reserved - int(mem.get("refs_on_device_bytes") or 0)
        with self._lock:
            self._side_peaks[key] = max(self._side_peaks.get(key, 0), side)

    def _starts_now(self, job: EvalJob, kind: str, gpu: str | None) -> bool:
        """Whether ``job`` would run at once on a slot of ``gpu`` (``_slots.JobQueue``): no probe of its problem
        is running, and its need fits the free memory. From what is known already (a slot asks under the
        queue's lock): a problem not estimated yet counts as ready, as every job did before."""
        budget = self._budgets.get(gpu if kind == "cuda" else "cpu")
        if budget is None:
            return True
        key = (job.problem.id, bool(job.small))
        with self._lock:
            if key not in self._estimates:
                return True
            if key in self._probes:
                return False
        need, _ = self._need(job.problem, bool(job.small), bool(job.retime), budget.budget)
        return budget.fits_now(need)

    def _note_peak(self, key: tuple[str, bool], peak: int) -> None:
        """A job measured ``key``'s reference peak: later jobs are admitted with the need it gives, and the
        jobs that waited for the probe go now, not when the probe's job ends."""
        with self._lock:
            self._ref_peaks[key] = max(self._ref_peaks.get(key, 0), int(peak))
            ev = self._probes.pop(key, None)
        if ev is not None:
            ev.set()

    def _probe_turn(self, job: EvalJob, budget: MemoryBudget) -> tuple[threading.Event | None, float]:
        """Wait while another job of this unmeasured problem is its probe (:func:`_gpu.probes`): (the event
        of the probe this job now is, or None; seconds waited)."""
        key = (job.problem.id, bool(job.small))
        t0 = time.monotonic()
        self.board.set(Phase.PROBE_WAIT)
        while True:
            need, _ = self._need(job.problem, bool(job.small), bool(job.retime), budget.budget)
            with self._lock:
                if (self._closed or key in self._ref_peaks or key in self._probed
                        or not probes(need, budget.budget)):
                    return None, time.monotonic() - t0
                ev = self._probes.get(key)
                if ev is None:
                    ev = self._probes[key] = threading.Event()
                    return ev, time.monotonic() - t0
            ev.wait(0.5)

    def _end_probe(self, key: tuple[str, bool], ev: threading.Event, kind: str) -> None:
        with self._lock:
            if self._probes.get(key) is ev:
                del self._probes[key]
                if kind != "cuda":  # no peak is measured off a GPU: the others go with the estimate
                    self._probed.add(key)
        ev.set()  # on a GPU without a peak (the probe failed first), the next waiting job probes

    def _evaluate(self, worker: _Worker, job: EvalJob, kind: str, gpu: str | None) -> tuple[dict, _Worker | None]:
        """Admit, run and retry (:meth:`_attempts`); a problem's first large job alone among its own
        (:meth:`_probe_turn`), until it has measured the reference's peak."""
        key = (job.problem.id, bool(job.small))
        budget = self._budgets.get(gpu if kind == "cuda" else "cpu")
        probe, waited = self._probe_turn(job, budget) if budget is not None else (None, 0.0)
        try:
            result, worker = self._attempts(worker, job, kind, gpu)
        finally:
            if probe is not None:
                self._end_probe(key, probe, kind)
        if budget is not None:
            mem = result["details"].setdefault("memory", {})
            mem["probe_wait_s"] = round(waited, 3)
            mem["probe"] = probe is not None
        return result, worker

    def _attempts(self, worker: _Worker, job: EvalJob, kind: str, gpu: str | None) -> tuple[dict, _Worker | None]:
        """Admit, run, and retry after an infrastructure failure or, on a GPU, after the candidate ran
        out of the memory it was granted while sharing the device (:func:`_gpu.retry_admission`: first
        with twice the grant, still sharing; alone after that), or beside reference outputs the job kept on
        the device (then alone, keeping none there)."""
        place = gpu if kind == "cuda" else "cpu"
        key = (job.problem.id, bool(job.small))
        alone, forced_reason, retry_need = False, None, None
        keep_none = False  # after an OOM beside reference outputs kept on the device: keep none there
        earlier: list[dict] = []
        while True:
            budget = self._budgets.get(place)
            need = grant = side = None
            t_admit = 0.0
            got_alone = budget is None
            reason = None
            try:
                if budget is not None:
                    need, floor = self._need(job.problem, bool(job.small), bool(job.retime), budget.budget)
                    if retry_need is not None:
                        need = max(need or 0, retry_need)
                    reason = forced_reason if alone else budget.why_alone(need)
                    t_admit = time.monotonic()
                    self.board.set(Phase.ADMISSION)
                    grant, got_alone = budget.admit(need, alone, floor)
                    t_admit = time.monotonic() - t_admit
                held = [grant]  # the job may give part of its grant back once its reference peak is measured
                try:
                    # a retry after running out of memory keeps the grant it is retried with, and later jobs of
                    # the problem what the retries grew its need to
                    with self._lock:
                        floor_ = grant if earlier else self._oom_needs.get(key)
                    side = self._side_floor(job.problem, bool(job.small), bool(job.retime)) if budget is not None else None
                    if keep_none and grant is not None:
                        side = grant  # the job's own side may take the whole grant: no output fits beside it
                    result, keep = self._run(worker, job, gpu, grant, held=held if budget is not None else None,
                                             regrant_floor=floor_, side=side)
                finally:
                    if budget is not None and grant is not None:
                        budget.release(held[0])
            except TooBig as exc:
                result, keep = infra_result(job.config, "infra:too_big", f"{job.problem.label}: {exc}: it cannot "
                                            "be evaluated on this device"), True
            except Exception as exc:  # a bug of ours: never leave the caller's future hanging
                result, keep = infra_result(job.config, "sandbox", repr(exc)), False
            if budget is not None:
                mem = result["details"].setdefault("memory", {})
                mem.update(need_bytes=need, grant_bytes=grant, alone=got_alone, budget_bytes=budget.budget,
                           admission_wait_s=round(t_admit, 3), alone_reason=reason if got_alone else None,
                           side_bytes=side)
                self._note_side((*key, bool(job.retime)), mem, result.get("error_class") or "")
                if need is None:  # admitted alone for want of an estimate: say why the estimate failed
                    mem["estimate_error"] = self._estimate_errors.get(key)
                peak = mem.get("reference_peak_bytes")
                if peak:
                    self._note_peak(key, need_peak(int(peak), int(mem.get("refs_on_device_bytes") or 0)))
            if not keep:
                self._workers.discard(worker)
                worker.kill()
                worker = None
            if earlier:
                first = earlier[0]
                result["details"]["retried_after"] = {k: first.get(k) for k in ("error_class", "error_text")}
                result["details"]["retries"] = [{k: e.get(k) for k in ("error_class", "grant_bytes", "alone", "peak_bytes",
                                                                       "peak_reserved_bytes", "gpu_s", "phase_s")}
                                                for e in earlier]
                result["details"]["gpu_s"] = result["details"].get("gpu_s", 0.0) + sum(e["gpu_s"] or 0.0 for e in earlier)
            cls = result.get("error_class") or ""
            refs_kept = int(((result.get("details") or {}).get("memory") or {}).get("refs_on_device_bytes") or 0)
            plan = retry_admission(cls, is_infra(result), kind, got_alone, grant,
                                   budget.budget if budget is not None else 0, len(earlier) + 1, refs_kept)
            if plan is None:
                return result, worker
            keep_none = keep_none or (cls in OOM_CLASSES and refs_kept > 0)
            alone, retry_need, forced_reason = plan
            if cls in OOM_CLASSES and retry_need is not None:
                # later jobs of this problem start with the grant that is being tried now
                with self._lock:
                    self._oom_needs[key] = max(self._oom_needs.get(key, 0), retry_need)
            d = result["details"]
            mem = d.get("memory") or {}
            earlier.append({"error_class": cls, "error_text": result.get("error_text"), "grant_bytes": grant,
                            "alone": got_alone, "peak_bytes": mem.get("peak_bytes"),
                            "peak_reserved_bytes": mem.get("peak_reserved_bytes"), "gpu_s": d.get("gpu_s", 0.0),
                            "phase_s": d.get("phase_s")})
            if worker is None:
                if self._closed or self._breaker_open(kind, gpu):
                    return result, None
                worker, err = self._start_worker(kind, gpu, "")
                if worker is None:
                    return result, None
