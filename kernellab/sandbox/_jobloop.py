"""One attempt of a job on its worker: the payload sent, the messages answered, the result completed.

:meth:`_JobLoop._run_measuring` sends the job and serves the worker until its result comes: it moves the phase's
deadline, takes and gives back the GPU's reader/writer lock for the worker, shrinks the job's grant on a
``regrant``, passes a measured reference peak and a reference's digest on, and times out or buries a worker
that died (:meth:`_died`). Around it: the torch.compile baseline cache (:meth:`_baseline_future`, one job of a
key measures it, the others wait for its future), a job's wall time by phase (:class:`_Spans`) and its device
seconds (:class:`_GpuClock`), and the speedups a finished result gets from the baseline (:meth:`_finish`).
Apart from the admission (``_admission``), which decides when and with what grant an attempt runs.

The mixin reads the executor's state that ``LocalExecutor.__init__`` sets: ``_lock``, ``limits``, ``_ids``,
``_baselines``, ``_gpu_locks``, ``_budgets``, ``max_jobs_per_worker``, ``ref_cache_bytes``; it passes a peak
on with ``_note_peak`` (``_admission``).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time
from typing import Any

from kernellab.problem import content_hash
from kernellab.vocab import VERSION_KEYS

from ._api import EvalJob, Limits
from ._gpu import POISON_CAP
from ._protocol import JobSpec, Msg, Phase
from ._result import empty_result, reference_key, truncate
from ._slots import _Worker


class _Spans:
    """Wall seconds of one job per phase as the executor sees it (``details.phase_s``), the waits for the
    GPU's reader/writer lock as phases of their own: what a pool's throughput and a job's overhead are made of."""

    def __init__(self, first: Phase, board: Any = None) -> None:
        self.label, self.since, self.s, self.board = first, time.monotonic(), {}, board
        if board is not None:
            board.set(first)

    def switch(self, label: Phase) -> Phase:
        if self.board is not None:
            self.board.set(label)
        now = time.monotonic()
        self.s[self.label] = self.s.get(self.label, 0.0) + now - self.since
        was, self.label, self.since = self.label, label, now
        return was

    def done(self) -> dict[str, float]:
        self.switch(Phase.END)
        return {str(k): round(v, 3) for k, v in self.s.items() if v > 0}  # plain keys: stored, sent on


class _GpuClock:
    """The device seconds one job costs, as the executor sees them (``details.gpu_s``; definition in
    ``_result``): ``lock_s`` while the job holds its GPU's timing lock, ``run_s`` from the candidate's
    first call to the end of the job outside the lock (waits for the lock count nowhere)."""

    def __init__(self) -> None:
        self.lock_s = self.run_s = 0.0
        self._run_since: float | None = None
        self._held_since: float | None = None
        self._started = False

    def start(self, now: float) -> None:
        if not self._started:
            self._started = True
            self._run_since = now

    def pause(self) -> None:
        if self._run_since is not None:
            self.run_s += time.monotonic() - self._run_since
            self._run_since = None

    def resume(self) -> None:
        if self._started and self._run_since is None and self._held_since is None:
            self._run_since = time.monotonic()

    def hold(self) -> None:
        self._held_since = time.monotonic()

    def release(self) -> None:
        if self._held_since is not None:
            self.lock_s += time.monotonic() - self._held_since
            self._held_since = None
        if self._started and self._run_since is None:
            self._run_since = time.monotonic()

    def stop(self) -> None:
        self.pause()
        if self._held_since is not None:
            self.lock_s += time.monotonic() - self._held_since
            self._held_since = None

    @property
    def total(self) -> float:
        return self.lock_s + self.run_s


class _JobLoop:
    """A job's attempt on a worker and its result's completion, for :class:`~kernellab.sandbox.LocalExecutor`
    (see the module docstring)."""

    def _baseline_future(self, job: EvalJob, key: str) -> tuple[cf.Future, bool]:
        """The cached torch.compile baseline for ``key`` and whether this job must measure it."""
        with self._lock:
            fut = self._baselines.get(key)
            if fut is not None:
                return fut, False
            fut = cf.Future()
            self._baselines[key] = fut
        row = None
        if job.store is not None:
            try:
                row = job.store.get_baseline(key)
            except Exception:
                row = None
        if row and row.get("compile_ms") is not None:
            fut.set_result(row)
            return fut, False
        return fut, True

    def _run(self, w: _Worker, job: EvalJob, gpu: str | None, grant: int | None = None,
             held: list | None = None, regrant_floor: int | None = None, side: int | None = None) -> tuple[dict, bool]:
        limits = job.limits or self.limits
        job_id = f"{os.getpid()}_{next(self._ids)}"
        key = need = bl_fut = None
        if w.kind == "cuda" and job.timing and not job.retime:
            v = w.info["versions"]
            vkey = {k: v.get(k) for k in VERSION_KEYS}  # sort_keys below: the cache keys stay as they were
            # the mode changes what is timed (batch statistics or running ones), so it keys the cache
            key = content_hash(job.problem.id, w.info["device"], json.dumps(vkey, sort_keys=True), str(job.small),
                               job.problem.mode)
            bl_fut, need = self._baseline_future(job, key)
        try:
            return self._run_measuring(w, job, gpu, grant, limits, job_id, key, need, bl_fut, held, regrant_floor, side)
        except BaseException:
            # every later job of this problem waits on the baseline this job was to measure: a failure of ours
            # here must hand the measuring on to the next job, never leave them waiting for good
            if need and not bl_fut.done():
                with self._lock:
                    self._baselines.pop(key, None)
                bl_fut.set_result(None)
            raise

    def _run_measuring(self, w: _Worker, job: EvalJob, gpu: str | None, grant: int | None, limits: Limits,
                       job_id: str, key: str | None, need: bool | None, bl_fut: cf.Future | None,
                       held: list | None = None, regrant_floor: int | None = None,
                       side: int | None = None) -> tuple[dict, bool]:
        """Run ``job`` on ``w``. ``held``: a one-item list with the job's grant, which a ``regrant`` from the
        worker shrinks (on the budget of the job's place) and ``_evaluate`` then releases."""
        payload = JobSpec(job_id=job_id, problem=job.problem, source=job.source, config=job.config, small=job.small,
                          trials=job.trials, timing=job.timing, need_baseline=need, max_jobs=self.max_jobs_per_worker,
                          timing_target_ms=job.timing_target_ms, stop_above_ms=job.stop_above_ms,
                          time_compile=bool(job.retime), gpu_grant_bytes=grant, regrant_floor_bytes=regrant_floor,
                          side_bytes=side,
                          poison_cap=min(POISON_CAP, grant // 8) if grant else POISON_CAP, prepare_only=job.prepare,
                          # a re-timing's printed numbers come from reference outputs computed in its own job
                          reuse_reference=not job.retime, ref_cache_bytes=self.ref_cache_bytes,
                          ref_digest=None if job.retime else w.ref_digests.get(
                              reference_key(job.problem.id, bool(job.small), job.trials, job.timing)))
        clock = _GpuClock()
        offset = w.log_size()
        lock = self._gpu_locks.get(gpu) if w.kind == "cuda" else None
        locked = reading = False
        regranted = None
        phase, deadline = Phase.LOAD, time.monotonic() + limits.of(Phase.LOAD)
        spans = _Spans(Phase.LOAD, self.board)  # where the job's wall time went, waits for the GPU's lock apart
        result: dict | None = None
        keep = True
        try:
            w.conn.send((Msg.JOB, payload))
            while result is None:
                timeout = max(0.0, deadline - time.monotonic())
                try:
                    ready = w.conn.poll(min(timeout, 0.5))
                    msg = w.conn.recv() if ready else None
                except (EOFError, OSError):
                    msg, ready = None, False
                    w.proc.wait(timeout=30)
                if msg is not None:
                    if msg[0] == Msg.PHASE:
                        now = time.monotonic()
                        phase, deadline = msg[1], now + limits.of(msg[1])
                        spans.switch(phase)
                        if phase == Phase.COMPILE:  # the candidate's first call
                            clock.start(now)
                    elif msg[0] == Msg.LOCK:  # the GPU to itself: timing
                        clock.pause()
                        if reading:  # never wait for the writer lock while holding a read
                            lock.release_read()
                            reading = False
                        spans.switch(Phase.WAIT_TIMING_LOCK)
                        lock.acquire_write()
                        spans.switch(Phase.TIMING)
                        locked = True
                        clock.hold()
                        phase, deadline = Phase.TIMING, time.monotonic() + limits.of(Phase.TIMING)
                        w.conn.send((Msg.GO,))
                    elif msg[0] == Msg.UNLOCK:
                        if locked:
                            lock.release_write()
                            locked = False
                        spans.switch(Phase.AFTER_TIMING)
                        clock.release()
                    elif msg[0] == Msg.READ:  # shared GPU work; the wait does not count against the phase
                        if lock is not None and not reading and not locked:
                            t0 = time.monotonic()
                            clock.pause()
                            was = spans.switch(Phase.WAIT_READ)
                            lock.acquire_read()
                            spans.switch(was)
                            reading = True
                            clock.resume()
                            deadline += time.monotonic() - t0
                        w.conn.send((Msg.GO,))
                    elif msg[0] == Msg.UNREAD:
                        if reading:
                            lock.release_read()
                            reading = False
                    elif msg[0] == Msg.REGRANT:  # the worker capped itself at its measured need
                        budget = self._budgets.get(gpu if w.kind == "cuda" else "cpu")
                        if held is not None and budget is not None and held[0] is not None:
                            held[0] = regranted = budget.shrink(held[0], int(msg[1]))
                    elif msg[0] == Msg.PEAK:  # the reference's measured peak, before the candidate runs
                        self._note_peak((job.problem.id, bool(job.small)), int(msg[1]))
                    elif msg[0] == Msg.REFERENCE:  # computed before the candidate was loaded
                        w.ref_digests[msg[1]] = msg[2]
                    elif msg[0] == Msg.RESULT:
                        result, keep = msg[1], not msg[2]
                    continue
                if w.proc.poll() is not None:
                    result, keep = self._died(w, job, phase, offset), False
                elif time.monotonic() >= deadline:
                    w.kill()
                    result, keep = empty_result(job.config), False
                    result.update(status="timeout", error_class=f"timeout:{phase}",
                                  error_text=f"the {phase} phase exceeded its limit of {limits.of(phase):g} s")
                    result["details"]["phase"] = str(phase)
        finally:
            if locked:
                lock.release_write()
            if reading:
                lock.release_read()
            clock.stop()
        result["details"]["phase_s"] = spans.done()
        if regranted is not None:  # what the job held after its reference peak was measured
            result["details"].setdefault("memory", {})["regrant_bytes"] = regranted
        result["details"]["gpu_s"] = clock.total
        result["details"]["gpu_s_parts"] = {"lock_s": clock.lock_s, "run_s": clock.run_s}
        if need:
            measured = result["details"].pop("baseline_measured", None)
            if measured and measured.get("compile_ms") is not None:
                row = {"problem_id": job.problem.id, "device": w.info["device"], "versions_json": w.info["versions"],
                       "small": int(bool(job.small)), **{k: measured.get(k) for k in
                                                         ("eager_ms", "compile_ms", "compile_p20_ms", "compile_p80_ms")}}
                if job.store is not None:
                    try:
                        job.store.put_baseline(key, row)
                    except Exception as exc:  # the cache is an optimisation: say so, go on
                        result["details"]["baseline_store_error"] = repr(exc)
                bl_fut.set_result(row)
            elif measured:  # torch.compile failed on this problem: remember it, do not retry per job
                result["details"]["compile_error"] = measured.get("error")
                bl_fut.set_result({"compile_ms": None, "error": measured.get("error")})
            else:  # the worker died or timed out first: let the next job of this key measure it
                with self._lock:
                    self._baselines.pop(key, None)
                bl_fut.set_result(None)
        if bl_fut is not None:
            result["details"]["_baseline_future"] = bl_fut
        if keep and w.proc.poll() is not None:
            keep = False
        return result, keep

    def _died(self, w: _Worker, job: EvalJob, phase: Phase, offset: int) -> dict:
        rc = w.proc.returncode
        if rc is not None and rc < 0:
            try:
                how = signal.Signals(-rc).name
            except ValueError:
                how = f"signal {-rc}"
            cls = f"signal:{how}"
        else:
            how, cls = f"exit code {rc}", f"exit:{rc}"
        r = empty_result(job.config)
        tail = w.log_tail(offset)
        r.update(status="crash", error_class=cls,
                 error_text=truncate(f"the worker process died during the {phase} phase ({how})"
                                     + (f"; its output ends with:\n{tail}" if tail.strip() else "")))
        r["details"]["phase"] = str(phase)
        return r

    def _finish(self, job: EvalJob, fut: cf.Future, result: dict, worker: _Worker | None) -> None:
        if job.tag is not None:
            result["details"]["tag"] = job.tag
        bl = result["details"].pop("_baseline_future", None)

        def done(b: cf.Future | None = None) -> None:
            row = b.result() if b is not None else None
            _speedups(result, row)
            fut.set_result(result)

        if bl is None:
            done()
        else:
            bl.add_done_callback(done)


def _speedups(r: dict, baseline: dict | None) -> None:
    if r.get("interpreted"):
        r["speedup_eager"] = r["speedup_compile"] = None
        r["compile_ms"] = None
        return
    if baseline:
        r["compile_ms"] = baseline.get("compile_ms")
        r["details"]["baseline"] = {k: baseline.get(k) for k in ("compile_ms", "compile_p20_ms", "compile_p80_ms",
                                                                  "eager_ms")}
    if r.get("status") == "correct" and r.get("median_ms"):
        if r.get("eager_ms"):
            r["speedup_eager"] = r["eager_ms"] / r["median_ms"]
        if r.get("compile_ms"):
            r["speedup_compile"] = r["compile_ms"] / r["median_ms"]
