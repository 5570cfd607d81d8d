"""Executors: submit an :class:`EvalJob`, get a ``concurrent.futures.Future`` of its result dict.

:class:`LocalExecutor` keeps a pool of worker processes on this host: ``workers_per_gpu`` per visible
GPU (each worker sees exactly one GPU), or ``cpu_workers`` running the Triton interpreter. Each pool
slot is a thread of the caller's process that owns one worker: it sends the job, enforces the time
limit of the phase the worker announces, grants the per-GPU timing lock (one timing per GPU at a
time; loading, compiling and checking overlap), and replaces the worker after a timeout, a crash,
a CUDA fault or a rejection. A distributed executor implements the same two methods.

    from kernellab.sandbox import EvalJob, LocalExecutor
    with LocalExecutor() as ex:
        futures = [ex.submit(EvalJob(problem, src, config=c)) for c in configs]
        results = [f.result() for f in futures]
"""

from __future__ import annotations

import abc
import atexit
import concurrent.futures as cf
import itertools
import json
import math
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kernellab.problem import Problem, content_hash

from ._env import protect_parent, worker_env
from ._result import empty_result, truncate

__all__ = ["Limits", "EvalJob", "Executor", "LocalExecutor", "default_executor", "SandboxError"]


class SandboxError(ValueError):
    """A job that cannot be evaluated as asked (bad arguments, no such device)."""


@dataclass(frozen=True)
class Limits:
    """Seconds allowed per phase. ``load`` covers building the reference and executing the candidate's
    module, ``compile`` its first call (Triton/NVRTC compile there), ``check`` the remaining trials,
    ``timing`` the timed runs (waiting for the GPU's timing lock is not counted), ``baseline`` the
    one-off torch.compile of the reference."""

    load: float = 120.0
    compile: float = 300.0
    check: float = 300.0
    timing: float = 300.0
    baseline: float = 900.0
    startup: float = 300.0

    def of(self, phase: str) -> float:
        return float(getattr(self, phase, self.check))


@dataclass
class EvalJob:
    """One evaluation. ``small=None``: SMALL sizes on the CPU, full sizes on CUDA; ``device=None``:
    CUDA when available. ``store`` (optional) caches the torch.compile baseline; ``tag`` is the
    caller's, returned untouched in ``result["details"]["tag"]``.

    ``timing_target_ms`` asks for a cheaper timing (Optuna trials): the same method, aiming at this
    much timed work instead of the full timing's ``GPU_TARGET_MS`` (300 ms), with the repetition
    bounds scaled down alike (``_timing.rep_bounds``; on the CPU the wall-clock timing shrinks by the
    same ratio). ``stop_above_ms`` stops the timing when the candidate's median over its first
    repetitions (5 on the GPU, 3 on the CPU) is already above it: the result is still ``correct``
    (every correctness and integrity check has run), its timings cover those repetitions, and
    ``details.early_stopped`` is True. A timing that has no repetitions left to skip is complete.

    ``retime``: a winner's re-timing, whose printed speedups must be same-job ratios: on CUDA the
    job compiles the reference with torch.compile itself (before the candidate is loaded) and times
    it interleaved with the candidate and eager; the cached baseline is neither read nor written."""

    problem: Problem
    source: str
    config: dict | None = None
    small: bool | None = None
    device: str | None = None
    trials: int = 5
    timing: bool = True
    limits: Limits | None = None
    store: Any = field(default=None, repr=False)
    tag: Any = None
    timing_target_ms: float | None = None
    stop_above_ms: float | None = None
    retime: bool = False


class Executor(abc.ABC):
    """Runs evaluation jobs somewhere else than the calling process."""

    @abc.abstractmethod
    def submit(self, job: EvalJob) -> cf.Future:
        """Queue ``job``; the future's result is the evaluation dict (it never raises for candidate
        failures: those are statuses)."""

    @abc.abstractmethod
    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers; queued jobs not started get a ``crash`` result saying so."""

    def map(self, jobs: list[EvalJob]) -> list[dict]:
        futures = [self.submit(j) for j in jobs]
        return [f.result() for f in futures]

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def _visible_gpus() -> list[str]:
    from kernellab.env import has_cuda

    if not has_cuda():
        return []
    import torch

    n = torch.cuda.device_count()
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in vis.split(",") if v.strip()] if vis else [str(i) for i in range(n)]
    return ids[:n]


class _Worker:
    """Parent-side handle of one worker process."""

    def __init__(self, kind: str, gpu: str | None, limits: Limits, cpu_memory_gb: float | None,
                 gpu_fraction: float | None = None) -> None:
        self.home = tempfile.mkdtemp(prefix="kernellab-worker-")
        self.kind = kind
        extra = {"KERNELLAB_SANDBOX_DEVICE": kind}
        if kind == "cuda":
            extra["CUDA_VISIBLE_DEVICES"] = gpu or "0"
            if gpu_fraction:
                extra["KERNELLAB_SANDBOX_GPU_FRACTION"] = f"{gpu_fraction:.3f}"
        else:
            extra["CUDA_VISIBLE_DEVICES"] = ""
            extra["TRITON_INTERPRET"] = "1"
            if cpu_memory_gb:
                extra["KERNELLAB_SANDBOX_MEMORY_GB"] = str(cpu_memory_gb)
        protect_parent()
        env = worker_env(self.home, extra)
        if kind == "cuda":
            env.pop("TRITON_INTERPRET", None)
        parent, child = socket.socketpair()
        self.log_path = Path(self.home) / "worker.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kernellab.sandbox._worker", str(child.fileno())],
                cwd=self.home, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=[child.fileno()], start_new_session=True)
        child.close()
        self.conn = Connection(parent.detach())
        self.info: dict = {}
        deadline = time.monotonic() + limits.startup
        while not self.conn.poll(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail(0)
                self.kill()
                raise RuntimeError(f"sandbox worker failed to start (exit {self.proc.returncode}): {tail}")
        msg = self.conn.recv()
        if msg[0] != "ready":
            self.kill()
            raise RuntimeError(f"sandbox worker failed to start: {truncate(str(msg[1]), 2000)}")
        self.info = msg[1]

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def log_tail(self, offset: int, n: int = 3000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except OSError:
            return ""
        return data[-n:].decode("utf-8", "replace")

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        self.close()

    def stop(self) -> None:
        try:
            self.conn.send(("exit",))
            self.proc.wait(timeout=10)
        except Exception:
            pass
        self.kill()

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass
        shutil.rmtree(self.home, ignore_errors=True)


_SENTINEL = object()


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


class LocalExecutor(Executor):
    """A pool of sandbox worker processes on this host (see the module docstring).

    Workers start lazily, on the first job for their device kind, and live across jobs (starting a
    process that imports torch costs seconds); a worker is replaced after ``max_jobs_per_worker``
    jobs or any job that ended in ``timeout``, ``crash`` or ``rejected``."""

    def __init__(self, workers_per_gpu: int | None = None, cpu_workers: int | None = None,
                 limits: Limits | None = None, max_jobs_per_worker: int = 50,
                 cpu_memory_gb: float | None = 8.0, gpu_memory_fraction: float | None = None) -> None:
        ncpu = os.cpu_count() or 2
        self._gpus = _visible_gpus()
        self.workers_per_gpu = workers_per_gpu or max(1, min(8, ncpu // max(1, 2 * len(self._gpus or [0]))))
        self.cpu_workers = cpu_workers or max(1, min(4, ncpu // 2))
        self.limits = limits or Limits()
        self.max_jobs_per_worker = max_jobs_per_worker
        self.cpu_memory_gb = cpu_memory_gb
        # A candidate that allocates until out of memory must not starve the candidates evaluated
        # next to it on the same GPU: each worker may use this share of the device's memory.
        self.gpu_memory_fraction = gpu_memory_fraction or max(0.25, 0.95 / self.workers_per_gpu)
        self._queues: dict[str, queue.Queue] = {"cuda": queue.Queue(), "cpu": queue.Queue()}
        self._threads: dict[str, list[threading.Thread]] = {"cuda": [], "cpu": []}
        self._gpu_locks = {g: threading.Lock() for g in self._gpus}
        self._lock = threading.Lock()
        self._baselines: dict[str, cf.Future] = {}
        self._ids = itertools.count()
        self._closed = False
        self._workers: set[_Worker] = set()

    # -- public --------------------------------------------------------------------------------
    def submit(self, job: EvalJob) -> cf.Future:
        if self._closed:
            raise SandboxError("this executor has been shut down")
        if not isinstance(job.problem, Problem):
            raise SandboxError(f"job.problem must be a kernellab.Problem, not {type(job.problem).__name__}")
        if not isinstance(job.source, str):
            raise SandboxError("job.source must be the candidate's Python source text")
        kind = job.device or ("cuda" if self._gpus else "cpu")
        if kind.startswith("cuda"):
            kind = "cuda"
        if kind not in ("cuda", "cpu"):
            raise SandboxError(f"device must be 'cpu' or 'cuda', not {job.device!r}")
        if kind == "cuda" and not self._gpus:
            raise SandboxError("device 'cuda' was asked for but no CUDA device is visible")
        for name in ("timing_target_ms", "stop_above_ms"):
            v = getattr(job, name)
            if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                      and math.isfinite(v) and v > 0):
                raise SandboxError(f"{name} must be a positive number of milliseconds or None, got {v!r}")
        small = job.small if job.small is not None else (kind == "cpu")
        job = replace(job, device=kind, small=bool(small), limits=job.limits or self.limits)
        fut: cf.Future = cf.Future()
        fut.set_running_or_notify_cancel()
        self._ensure_slots(kind)
        self._queues[kind].put((job, fut))
        return fut

    def start(self, device: str | None = None, timeout: float = 600.0) -> int:
        """Start every worker of ``device``'s pool now and wait until they are ready (workers
        otherwise start on the first job); returns how many are running."""
        kind = "cuda" if (device or ("cuda" if self._gpus else "cpu")).startswith("cuda") else "cpu"
        self._ensure_slots(kind)
        n = len(self._threads[kind])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            running = sum(1 for w in list(self._workers) if w.kind == kind)
            if running >= n:
                return running
            time.sleep(0.1)
        return sum(1 for w in list(self._workers) if w.kind == kind)

    def shutdown(self, wait: bool = True) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for kind, threads in self._threads.items():
            for _ in threads:
                self._queues[kind].put(_SENTINEL)
        if wait:
            for threads in self._threads.values():
                for t in threads:
                    t.join(timeout=60)
        for w in list(self._workers):
            w.kill()
        for q in self._queues.values():  # jobs nobody will run
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if item is not _SENTINEL:
                    r = empty_result(item[0].config)
                    r.update(status="crash", error_class="shutdown", error_text="the executor was shut down")
                    item[1].set_result(r)

    # -- slots -----------------------------------------------------------------------------------
    def _ensure_slots(self, kind: str) -> None:
        with self._lock:
            if self._threads[kind]:
                return
            places = [(g, i) for g in self._gpus for i in range(self.workers_per_gpu)] if kind == "cuda" \
                else [(None, i) for i in range(self.cpu_workers)]
            for gpu, i in places:
                t = threading.Thread(target=self._slot, args=(kind, gpu), daemon=True,
                                     name=f"kernellab-sandbox-{kind}{gpu or ''}-{i}")
                self._threads[kind].append(t)
                t.start()

    def _slot(self, kind: str, gpu: str | None) -> None:
        worker: _Worker | None = None
        start_error = "no worker was started"
        q = self._queues[kind]
        while True:
            if worker is None and not self._closed:
                try:
                    worker = _Worker(kind, gpu, self.limits, self.cpu_memory_gb, self.gpu_memory_fraction)
                    self._workers.add(worker)
                except Exception as exc:
                    worker = None
                    start_error = str(exc)
            item = q.get()
            if item is _SENTINEL:
                break
            job, fut = item
            if worker is None:
                r = empty_result(job.config)
                if self._closed:  # queued before the shutdown: no worker was started for it
                    r.update(status="crash", error_class="shutdown", error_text="the executor was shut down")
                else:
                    r.update(status="crash", error_class="worker_start", error_text=truncate(start_error))
                fut.set_result(r)
                continue
            try:
                result, keep = self._run(worker, job, gpu)
            except Exception as exc:  # a bug of ours: never leave the caller's future hanging
                result, keep = empty_result(job.config), False
                result.update(status="crash", error_class="sandbox", error_text=truncate(repr(exc)))
            if not keep:
                self._workers.discard(worker)
                worker.kill()
                worker = None
            self._finish(job, fut, result, worker)
        if worker is not None:
            self._workers.discard(worker)
            worker.stop()

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

    def _run(self, w: _Worker, job: EvalJob, gpu: str | None) -> tuple[dict, bool]:
        limits = job.limits or self.limits
        job_id = f"{os.getpid()}_{next(self._ids)}"
        key = need = bl_fut = None
        if w.kind == "cuda" and job.timing and not job.retime:
            v = w.info["versions"]
            vkey = {k: v.get(k) for k in ("torch", "cuda", "triton", "driver", "python")}
            # the mode changes what is timed (batch statistics or running ones), so it keys the cache
            key = content_hash(job.problem.id, w.info["device"], json.dumps(vkey, sort_keys=True), str(job.small),
                               job.problem.mode)
            bl_fut, need = self._baseline_future(job, key)
        payload = {"job_id": job_id, "problem": job.problem, "source": job.source, "config": job.config,
                   "small": job.small, "trials": job.trials, "timing": job.timing, "need_baseline": need,
                   "max_jobs": self.max_jobs_per_worker, "timing_target_ms": job.timing_target_ms,
                   "stop_above_ms": job.stop_above_ms, "time_compile": bool(job.retime)}
        clock = _GpuClock()
        offset = w.log_size()
        lock = self._gpu_locks.get(gpu) if w.kind == "cuda" else None
        locked = False
        phase, deadline = "load", time.monotonic() + limits.of("load")
        result: dict | None = None
        keep = True
        try:
            w.conn.send(("job", payload))
            while result is None:
                timeout = max(0.0, deadline - time.monotonic())
                try:
                    ready = w.conn.poll(min(timeout, 0.5))
                    msg = w.conn.recv() if ready else None
                except (EOFError, OSError):
                    msg, ready = None, False
                    w.proc.wait(timeout=30)
                if msg is not None:
                    if msg[0] == "phase":
                        now = time.monotonic()
                        phase, deadline = msg[1], now + limits.of(msg[1])
                        if phase == "compile":  # the candidate's first call
                            clock.start(now)
                    elif msg[0] == "lock":
                        clock.pause()
                        lock.acquire()
                        locked = True
                        clock.hold()
                        phase, deadline = "timing", time.monotonic() + limits.of("timing")
                        w.conn.send(("go",))
                    elif msg[0] == "unlock":
                        if locked:
                            lock.release()
                            locked = False
                        clock.release()
                    elif msg[0] == "result":
                        result, keep = msg[1], not msg[2]
                    continue
                if w.proc.poll() is not None:
                    result, keep = self._died(w, job, phase, offset), False
                elif time.monotonic() >= deadline:
                    w.kill()
                    result, keep = empty_result(job.config), False
                    result.update(status="timeout", error_class=f"timeout:{phase}",
                                  error_text=f"the {phase} phase exceeded its limit of {limits.of(phase):g} s")
                    result["details"]["phase"] = phase
        finally:
            if locked:
                lock.release()
            clock.stop()
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

    def _died(self, w: _Worker, job: EvalJob, phase: str, offset: int) -> dict:
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
        r["details"]["phase"] = phase
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


_default: LocalExecutor | None = None
_default_lock = threading.Lock()


def default_executor() -> LocalExecutor:
    """The process-wide executor behind :func:`evaluate` (workers are reused across calls and
    stopped at interpreter exit)."""
    global _default
    with _default_lock:
        if _default is None or _default._closed:
            _default = LocalExecutor()
            atexit.register(_default.shutdown)
        return _default
