"""Executors: submit an :class:`EvalJob`, get a ``concurrent.futures.Future`` of its result dict.

:class:`LocalExecutor` keeps a pool of worker processes on this host: ``workers_per_gpu`` per visible
GPU (each worker sees exactly one GPU), or ``cpu_workers`` running the Triton interpreter. Each pool
slot is a thread of the caller's process that owns one worker: it admits the job to its GPU's memory
budget (the job's footprint, estimated from the problem; as many jobs share it as fit), sends the job,
enforces the time limit of the phase the worker announces, holds the GPU's reader/writer lock for the
worker (timing and profiling as the writer, with the GPU to themselves; the reference, poison, trials
and the candidate's calls as readers, shared; host-only work -- Triton and NVRTC compiles -- holds
nothing), and replaces the worker
after a timeout, a crash, a CUDA fault or a rejection. A failure of our own machinery (an
out-of-memory outside the candidate's code, a worker that does not start, a bug of ours) is an
infrastructure result (``details.infra``), retried (``_gpu.retry_admission``: an out-of-memory while
sharing first with twice the grant, still sharing; otherwise alone on the GPU), never the candidate's
verdict; after ``BREAKER_FAILURES`` worker starts in a row fail on one device, the executor stops
trying there and answers at once. A distributed executor implements the same two methods.

    from kernellab.sandbox import EvalJob, LocalExecutor
    with LocalExecutor() as ex:
        futures = [ex.submit(EvalJob(problem, src, config=c)) for c in configs]
        results = [f.result() for f in futures]
"""

from __future__ import annotations

import abc
import atexit
import concurrent.futures as cf
import contextlib
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
from kernellab.vocab import VERSION_KEYS, small_for

from ._env import protect_parent, worker_env
from ._gpu import (
    GIB,
    OOM_CLASSES,
    POISON_CAP,
    MemoryBudget,
    RWLock,
    TooBig,
    estimate,
    measured_need,
    probes,
    retry_admission,
    unmeasured_need,
)
from ._result import empty_result, infra_result, is_infra, reference_key, truncate

__all__ = ["Limits", "EvalJob", "Executor", "LocalExecutor", "ProfileGate", "default_executor", "SandboxError"]


class SandboxError(ValueError):
    """A job that cannot be evaluated as asked (bad arguments, no such device)."""


@dataclass(frozen=True)
class Limits:
    """Seconds allowed per phase. ``load`` covers executing the candidate's
    module, ``compile`` its first call (Triton/NVRTC compile there), ``check`` the remaining trials,
    ``timing`` the timed runs (waiting for the GPU's timing lock is not counted), ``baseline`` the
    one-off torch.compile of the reference, ``reference`` the reference's outputs for every trial; any
    other phase (``follow``, ``kernel_share``) has the ``check`` limit."""

    load: float = 120.0
    reference: float = 300.0
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
    it interleaved with the candidate and eager; the cached baseline is neither read nor written.

    ``prepare``: no candidate (``source`` is not read): the job computes the problem's reference outputs
    (kept by its worker) and, on CUDA, the torch.compile baseline, ahead of the campaign's first
    evaluations (:meth:`LocalExecutor.prepare`); its result (``details.prepared``) is not a verdict."""

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
    prepare: bool = False


def check_job(job: EvalJob, closed: bool) -> None:
    """What every executor checks of a job when it is submitted (one-line ``SandboxError``s)."""
    if closed:
        raise SandboxError("this executor has been shut down")
    if not isinstance(job.problem, Problem):
        raise SandboxError(f"job.problem must be a kernellab.Problem, not {type(job.problem).__name__}")
    if not isinstance(job.source, str):
        raise SandboxError("job.source must be the candidate's Python source text")
    for name in ("timing_target_ms", "stop_above_ms"):
        v = getattr(job, name)
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool)
                                  and math.isfinite(v) and v > 0):
            raise SandboxError(f"{name} must be a positive number of milliseconds or None, got {v!r}")


class Executor(abc.ABC):
    """Runs evaluation jobs somewhere else than the calling process."""

    @abc.abstractmethod
    def submit(self, job: EvalJob) -> cf.Future:
        """Queue ``job``; the future's result is the evaluation dict (it never raises for candidate
        failures: those are statuses)."""

    @abc.abstractmethod
    def shutdown(self, wait: bool = True) -> None:
        """Stop the workers; queued jobs not started get a ``crash`` result saying so."""

    def warm(self, device: str | None = None) -> None:
        """Start workers ahead of the first job, where the executor can (default: nothing to do)."""
        return None

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

    def __init__(self, kind: str, gpu: str | None, limits: Limits, cpu_memory_gb: float | None) -> None:
        self.home = tempfile.mkdtemp(prefix="kernellab-worker-")
        self.kind = kind
        extra = {"KERNELLAB_SANDBOX_DEVICE": kind}
        if kind == "cuda":
            extra["CUDA_VISIBLE_DEVICES"] = gpu or "0"
            # Inductor compiles in the worker itself, where _worker.release_for_compiles sees its Triton
            # compiles (in a compile subprocess the worker would wait for them holding the GPU)
            extra.setdefault("TORCHINDUCTOR_COMPILE_THREADS", os.environ.get("TORCHINDUCTOR_COMPILE_THREADS", "1"))
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
        # reference outputs this worker holds (sandbox._job._References), by key: the digest it reported
        # when it computed them, before that job's candidate ran -- what a later job's reuse is checked against
        self.ref_digests: dict[str, str] = {}
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


class ProfileGate:
    """One profiling run's hold of its GPU: none while the profiled process starts (imports under ncu take
    seconds of CPU only), :meth:`share` once it builds the problem on the GPU and warms up (a job's
    correctness work holds the GPU alike), :meth:`exclusive` around the profiled forward. A reader's hold
    held through that start-up stalled every timing, and, phase-fair, every reader queued behind the
    timing: in a 6-job bench on the H200 each tuning's re-timings waited out a whole profile (15-20 s)."""

    def __init__(self, gpu: str | None, lock: RWLock | None) -> None:
        self.gpu, self._lock, self._mode = gpu, lock, None
        self.seconds: dict[str, float] = {}  # the run's phases, as sandbox.profile's gated run saw them

    def share(self) -> None:
        if self._lock is not None and self._mode is None:
            self._lock.acquire_read()
            self._mode = "read"

    def unshare(self) -> None:
        """The process does host-only work (a compiler) for a while: its share given up until :meth:`share`."""
        if self._mode == "read":
            self._lock.release_read()
            self._mode = None

    @contextlib.contextmanager
    def exclusive(self):
        if self._lock is None:
            yield
            return
        if self._mode == "read":
            self._lock.release_read()  # never wait for the writer lock while holding a read
            self._mode = None
        self._lock.acquire_write()
        self._mode = "write"
        try:
            yield
        finally:
            self._lock.release_write()
            self._mode = None

    def close(self) -> None:
        if self._mode == "read":
            self._lock.release_read()
        self._mode = None


def host_workers_per_gpu(ncpu: int, ngpus: int) -> int:
    """Sandbox workers per GPU sized to the host, not to how many campaigns run: two cores a worker
    (its compiles and checks run on the host), at most ``MAX_WORKERS_PER_GPU``. Memory admission, not
    the worker count, keeps large problems from running out of the card."""
    return max(1, min(MAX_WORKERS_PER_GPU, ncpu // max(1, 2 * max(1, ngpus))))


def reference_cache_bytes(workers: int, total: int | None = None) -> int:
    """Host memory each worker may keep reference outputs in between jobs: half the host's memory shared
    among the pool, at most ``REF_CACHE_MAX`` (a job holds its reference outputs on the host anyway; this
    is what stays between jobs)."""
    if total is None:
        try:
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            total = 0
    return int(min(REF_CACHE_MAX, total // (2 * max(1, workers))))


MAX_WORKERS_PER_GPU = 8
REF_CACHE_MAX = 16 * GIB
_SENTINEL = object()
# consecutive failed worker starts on one device after which the executor stops trying there
BREAKER_FAILURES = 3
# kept out of a GPU's memory budget: per worker its CUDA context, plus fragmentation and other users
GPU_MARGIN = 2 * GIB
CONTEXT_BYTES = 768 << 20
# an estimated need (no reference peak measured yet) is admitted at this many times the estimate
UNMEASURED_MARGIN = 2


class _Spans:
    """Wall seconds of one job per phase as the executor sees it (``details.phase_s``), the waits for the
    GPU's reader/writer lock as phases of their own: what a pool's throughput and a job's overhead are made of."""

    def __init__(self, first: str) -> None:
        self.label, self.since, self.s = first, time.monotonic(), {}

    def switch(self, label: str) -> str:
        now = time.monotonic()
        self.s[self.label] = self.s.get(self.label, 0.0) + now - self.since
        was, self.label, self.since = self.label, label, now
        return was

    def done(self) -> dict[str, float]:
        self.switch("end")
        return {k: round(v, 3) for k, v in self.s.items() if v > 0}


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


class LocalExecutor(Executor):
    """A pool of sandbox worker processes on this host (see the module docstring).

    Workers start lazily, on the first job for their device kind, and live across jobs (starting a
    process that imports torch costs seconds); a worker is replaced after ``max_jobs_per_worker``
    jobs or any job that ended in ``timeout``, ``crash`` or ``rejected``.

    Memory: each GPU admits jobs against a byte budget, its total memory minus
    ``GPU_MARGIN + workers_per_gpu * CONTEXT_BYTES`` (CUDA contexts and fragmentation live outside
    the allocator's count), or ``gpu_bytes`` (also read from ``KERNELLAB_GPU_BYTES``) when given --
    which also puts the CPU pool under admission, the way tests exercise it without a GPU. A job's
    need is estimated from the problem on the meta device (admitted at ``UNMEASURED_MARGIN`` times the
    estimate) and, once a job of the problem has run on a GPU, from its reference's measured peak;
    its grant caps the worker's allocator (``set_per_process_memory_fraction``), so a runaway
    candidate cannot starve its neighbours."""

    def __init__(self, workers_per_gpu: int | None = None, cpu_workers: int | None = None,
                 limits: Limits | None = None, max_jobs_per_worker: int = 50,
                 cpu_memory_gb: float | None = 8.0, gpu_bytes: int | None = None,
                 ref_cache_bytes: int | None = None) -> None:
        ncpu = os.cpu_count() or 2
        self._gpus = _visible_gpus()
        self.workers_per_gpu = workers_per_gpu or host_workers_per_gpu(ncpu, len(self._gpus))
        self.cpu_workers = cpu_workers or max(1, min(4, ncpu // 2))
        self.limits = limits or Limits()
        self.max_jobs_per_worker = max_jobs_per_worker
        self.cpu_memory_gb = cpu_memory_gb
        # the host memory each worker may keep reference outputs in across jobs (0: none)
        pool = self.workers_per_gpu * len(self._gpus) if self._gpus else self.cpu_workers
        self.ref_cache_bytes = reference_cache_bytes(pool) if ref_cache_bytes is None else int(ref_cache_bytes)
        env_bytes = os.environ.get("KERNELLAB_GPU_BYTES")
        if gpu_bytes is None and env_bytes:
            try:
                gpu_bytes = int(float(env_bytes))
            except ValueError:
                raise SandboxError(f"KERNELLAB_GPU_BYTES must be a number of bytes, got {env_bytes!r}") from None
        if gpu_bytes is not None and gpu_bytes <= 0:
            raise SandboxError(f"gpu_bytes must be a positive number of bytes, got {gpu_bytes!r}")
        self.gpu_bytes = gpu_bytes
        self._queues: dict[str, queue.Queue] = {"cuda": queue.Queue(), "cpu": queue.Queue()}
        self._threads: dict[str, list[threading.Thread]] = {"cuda": [], "cpu": []}
        # per GPU: timing/profiling as writers, correctness work as readers (see _gpu.RWLock)
        self._gpu_locks = {g: RWLock() for g in self._gpus}
        # per GPU (and "cpu" when gpu_bytes is given): the memory admission; made when the total is known
        self._budgets: dict[str, MemoryBudget] = {}
        if gpu_bytes is not None:
            self._budgets["cpu"] = MemoryBudget(gpu_bytes)
            for g in self._gpus:
                self._budgets[g] = MemoryBudget(gpu_bytes)
        self._estimates: dict[tuple[str, bool], tuple[int, int] | None] = {}
        self._ref_peaks: dict[tuple[str, bool], int] = {}
        # per unmeasured problem: the event its probe (the one job that measures the reference's peak) sets
        self._probes: dict[tuple[str, bool], threading.Event] = {}
        self._probed: set[tuple[str, bool]] = set()  # probes that ended without a peak (the CPU pool)
        # per problem: the grant a job was retried with after running out of memory while sharing
        self._oom_needs: dict[tuple[str, bool], int] = {}
        self._start_failures: dict[tuple[str, str | None], int] = {}
        self.start_attempts = 0
        self._lock = threading.Lock()
        self._baselines: dict[str, cf.Future] = {}
        self._estimate_errors: dict[tuple[str, bool], str] = {}
        self._ids = itertools.count()
        self._in_flight = 0  # jobs submitted and not answered
        self._closed = False
        self._workers: set[_Worker] = set()

    # -- public --------------------------------------------------------------------------------
    def submit(self, job: EvalJob) -> cf.Future:
        check_job(job, self._closed)
        kind = job.device or ("cuda" if self._gpus else "cpu")
        if kind.startswith("cuda"):
            kind = "cuda"
        if kind not in ("cuda", "cpu"):
            raise SandboxError(f"device must be 'cpu' or 'cuda', not {job.device!r}")
        if kind == "cuda" and not self._gpus:
            raise SandboxError("device 'cuda' was asked for but no CUDA device is visible")
        small = small_for(kind, job.small)
        job = replace(job, device=kind, small=bool(small), limits=job.limits or self.limits)
        fut: cf.Future = cf.Future()
        fut.set_running_or_notify_cancel()
        with self._lock:
            self._in_flight += 1
        fut.add_done_callback(self._job_done)
        self._ensure_slots(kind)
        self._queues[kind].put((job, fut))
        return fut

    def _job_done(self, fut: cf.Future) -> None:
        with self._lock:
            self._in_flight -= 1

    def start(self, device: str | None = None, timeout: float = 600.0) -> int:
        """Start every worker of ``device``'s pool now and wait until they are ready (workers
        otherwise start on the first job); returns how many are running."""
        kind = self._pool_of(device)
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
            # one minute for all the jobs in flight together (a minute each added up to several)
            until = time.monotonic() + 60
            for threads in self._threads.values():
                for t in threads:
                    t.join(timeout=max(0.0, until - time.monotonic()))
        for w in list(self._workers):
            w.kill()
        for q in self._queues.values():  # jobs nobody will run
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    break
                if item is not _SENTINEL:
                    item[1].set_result(infra_result(item[0].config, "shutdown", "the executor was shut down"))

    @contextlib.contextmanager
    def exclusive_gpu(self, problem: Problem | None = None, small: bool = False, gpu: str | None = None):
        """Hold a GPU as the timing does: its reader/writer lock as the writer (no trial, poison or
        compile of any job runs there meanwhile) and, when its budget is known, memory admission for
        ``problem``'s footprint. Yields the GPU's id (for ``CUDA_VISIBLE_DEVICES``), or None when no
        GPU is visible. Nsight Compute profiling from a campaign runs inside it."""
        if not self._gpus:
            yield None
            return
        with self._admitted_on(problem, small, gpu) as g:
            with self._gpu_locks[g].write():
                yield g

    @contextlib.contextmanager
    def _admitted_on(self, problem: Problem | None, small: bool, gpu: str | None):
        """A GPU of this executor's (the first when ``gpu`` is None), admitted for ``problem``'s footprint."""
        g = gpu if gpu is not None else self._gpus[0]
        if g not in self._gpu_locks:
            raise SandboxError(f"GPU {g!r} is not one of this executor's ({', '.join(self._gpus)})")
        budget = self._budgets.get(g)
        need, floor = (self._need(problem, small, budget_bytes=budget.budget if budget is not None else None)
                       if problem is not None else (None, None))
        with budget.admitted(need, floor=floor) if budget is not None else contextlib.nullcontext():
            yield g

    @contextlib.contextmanager
    def profiling(self, problem: Problem | None = None, small: bool = False, gpu: str | None = None):
        """Hold a GPU for an Nsight Compute run as a job holds it: admitted for ``problem``'s footprint,
        nothing held while the profiled process starts, shared (its reader lock) while it builds the problem
        on the GPU and warms up (:meth:`ProfileGate.share`), alone only for the profiled forward
        (:meth:`ProfileGate.exclusive`, which ``sandbox.profile`` enters when its target is warm). Yields a
        :class:`ProfileGate` (``gate.gpu`` None when no GPU is visible)."""
        if not self._gpus:
            yield ProfileGate(None, None)
            return
        with self._admitted_on(problem, small, gpu) as g:
            gate = ProfileGate(g, self._gpu_locks[g])
            try:
                yield gate
            finally:
                gate.close()

    def prepare(self, problem: Problem, *, small: bool | None = None, device: str | None = None, trials: int = 5,
                store: Any = None) -> cf.Future | None:
        """Compute ``problem``'s reference outputs (kept by the worker that runs it) and its torch.compile
        baseline (cached for every later job) in a job of their own, now: a campaign calls this as it
        starts, so its first evaluations neither compile the baseline nor wait for it. Only on an idle
        pool (returns None otherwise): in a busy one the job competes with evaluations for workers and
        memory (in a 4-job bench of KernelBench's largest problems on the H200 it added a reference per
        problem and delayed the first evaluations)."""
        with self._lock:
            if self._in_flight:
                return None
        return self.submit(EvalJob(problem, "", small=small, device=device, trials=trials, store=store, prepare=True))

    def warm(self, device: str | None = None) -> None:
        """Start ``device``'s workers now, without waiting for them (a campaign calls this as it starts,
        so the pool's start-up overlaps its planning instead of delaying its first evaluation)."""
        if not self._closed:
            self._ensure_slots(self._pool_of(device))

    def _pool_of(self, device: str | None) -> str:
        """The pool ("cuda" or "cpu") a job for ``device`` runs in (None: CUDA when a GPU is visible)."""
        return "cuda" if (device or ("cuda" if self._gpus else "cpu")).startswith("cuda") else "cpu"

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
            if worker is None and not self._closed and not self._breaker_open(kind, gpu):
                worker, start_error = self._start_worker(kind, gpu, start_error)
            item = q.get()
            if item is _SENTINEL:
                break
            job, fut = item
            if worker is None and not self._closed and not self._breaker_open(kind, gpu):
                worker, start_error = self._start_worker(kind, gpu, start_error)  # once more, for this job
            if worker is None:
                if self._closed:  # queued before the shutdown: no worker was started for it
                    r = infra_result(job.config, "shutdown", "the executor was shut down")
                elif self._breaker_open(kind, gpu):
                    r = infra_result(job.config, "worker_start", self._breaker_text(kind, gpu, start_error),
                                     breaker=True)
                else:
                    r = infra_result(job.config, "worker_start", start_error)
                fut.set_result(r)
                continue
            result, worker = self._evaluate(worker, job, kind, gpu)
            self._finish(job, fut, result, worker)
        if worker is not None:
            self._workers.discard(worker)
            worker.stop()

    # -- worker starts and the circuit breaker ---------------------------------------------------
    def _breaker_open(self, kind: str, gpu: str | None) -> bool:
        return self._start_failures.get((kind, gpu), 0) >= BREAKER_FAILURES

    def _breaker_text(self, kind: str, gpu: str | None, last: str) -> str:
        where = f"cuda:{gpu}" if kind == "cuda" else "cpu"
        return truncate(f"sandbox workers failed to start {BREAKER_FAILURES} times in a row on {where}: the executor "
                        f"stopped trying there (circuit breaker). Last error: {last}")

    def _start_worker(self, kind: str, gpu: str | None, start_error: str) -> tuple[_Worker | None, str]:
        with self._lock:
            self.start_attempts += 1
        try:
            w = _Worker(kind, gpu, self.limits, self.cpu_memory_gb)
        except Exception as exc:
            with self._lock:
                self._start_failures[(kind, gpu)] = self._start_failures.get((kind, gpu), 0) + 1
            return None, str(exc)
        with self._lock:
            self._start_failures[(kind, gpu)] = 0
            self._workers.add(w)
            total = w.info.get("gpu_total_bytes")
            if kind == "cuda" and gpu not in self._budgets and total:
                # CUDA contexts and fragmentation live outside the allocator's count
                margin = GPU_MARGIN + self.workers_per_gpu * CONTEXT_BYTES
                self._budgets[gpu] = MemoryBudget(max(GIB, int(total) - margin))
        return w, start_error

    # -- memory ----------------------------------------------------------------------------------
    def _need(self, problem: Problem, small: bool, compile_timed: bool = False,
              budget_bytes: int | None = None) -> tuple[int | None, int | None]:
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
            need = unmeasured_need(need, budget_bytes, UNMEASURED_MARGIN) if budget_bytes else UNMEASURED_MARGIN * need
        with self._lock:
            grown = self._oom_needs.get(key)
        if grown is not None:
            need = max(need or 0, grown)
        if peak is not None:
            return max(need or 0, measured_need(peak, compile_timed)), max(floor or 0, peak)
        return need, floor

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
        with twice the grant, still sharing; alone after that)."""
        place = gpu if kind == "cuda" else "cpu"
        key = (job.problem.id, bool(job.small))
        alone, forced_reason, retry_need = False, None, None
        earlier: list[dict] = []
        while True:
            budget = self._budgets.get(place)
            need = grant = None
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
                    grant, got_alone = budget.admit(need, alone, floor)
                    t_admit = time.monotonic() - t_admit
                held = [grant]  # the job may give part of its grant back once its reference peak is measured
                try:
                    # a retry after running out of memory keeps the grant it is retried with, and later jobs of
                    # the problem what the retries grew its need to
                    with self._lock:
                        floor_ = grant if earlier else self._oom_needs.get(key)
                    result, keep = self._run(worker, job, gpu, grant, held=held if budget is not None else None,
                                             regrant_floor=floor_)
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
                           admission_wait_s=round(t_admit, 3), alone_reason=reason if got_alone else None)
                if need is None:  # admitted alone for want of an estimate: say why the estimate failed
                    mem["estimate_error"] = self._estimate_errors.get(key)
                peak = mem.get("reference_peak_bytes")
                if peak:
                    self._note_peak(key, int(peak))
            if not keep:
                self._workers.discard(worker)
                worker.kill()
                worker = None
            if earlier:
                first = earlier[0]
                result["details"]["retried_after"] = {k: first.get(k) for k in ("error_class", "error_text")}
                result["details"]["retries"] = [{k: e.get(k) for k in ("error_class", "grant_bytes", "alone", "peak_bytes",
                                                                       "gpu_s", "phase_s")} for e in earlier]
                result["details"]["gpu_s"] = result["details"].get("gpu_s", 0.0) + sum(e["gpu_s"] or 0.0 for e in earlier)
            cls = result.get("error_class") or ""
            plan = retry_admission(cls, is_infra(result), kind, got_alone, grant,
                                   budget.budget if budget is not None else 0, len(earlier) + 1)
            if plan is None:
                return result, worker
            alone, retry_need, forced_reason = plan
            if cls in OOM_CLASSES and retry_need is not None:
                # later jobs of this problem start with the grant that is being tried now
                with self._lock:
                    self._oom_needs[key] = max(self._oom_needs.get(key, 0), retry_need)
            d = result["details"]
            mem = d.get("memory") or {}
            earlier.append({"error_class": cls, "error_text": result.get("error_text"), "grant_bytes": grant,
                            "alone": got_alone, "peak_bytes": mem.get("peak_bytes"), "gpu_s": d.get("gpu_s", 0.0),
                            "phase_s": d.get("phase_s")})
            if worker is None:
                if self._closed or self._breaker_open(kind, gpu):
                    return result, None
                worker, err = self._start_worker(kind, gpu, "")
                if worker is None:
                    return result, None

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
             held: list | None = None, regrant_floor: int | None = None) -> tuple[dict, bool]:
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
            return self._run_measuring(w, job, gpu, grant, limits, job_id, key, need, bl_fut, held, regrant_floor)
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
                       held: list | None = None, regrant_floor: int | None = None) -> tuple[dict, bool]:
        """Run ``job`` on ``w``. ``held``: a one-item list with the job's grant, which a ``regrant`` from the
        worker shrinks (on the budget of the job's place) and ``_evaluate`` then releases."""
        payload = {"job_id": job_id, "problem": job.problem, "source": job.source, "config": job.config,
                   "small": job.small, "trials": job.trials, "timing": job.timing, "need_baseline": need,
                   "max_jobs": self.max_jobs_per_worker, "timing_target_ms": job.timing_target_ms,
                   "stop_above_ms": job.stop_above_ms, "time_compile": bool(job.retime), "gpu_grant_bytes": grant,
                   "regrant_floor_bytes": regrant_floor,
                   "poison_cap": min(POISON_CAP, grant // 8) if grant else POISON_CAP, "prepare_only": job.prepare,
                   # a re-timing's printed numbers come from reference outputs computed in its own job
                   "reuse_reference": not job.retime, "ref_cache_bytes": self.ref_cache_bytes,
                   "ref_digest": None if job.retime else w.ref_digests.get(
                       reference_key(job.problem.id, bool(job.small), job.trials, job.timing))}
        clock = _GpuClock()
        offset = w.log_size()
        lock = self._gpu_locks.get(gpu) if w.kind == "cuda" else None
        locked = reading = False
        regranted = None
        phase, deadline = "load", time.monotonic() + limits.of("load")
        spans = _Spans("load")  # where the job's wall time went, waits for the GPU's lock apart
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
                        spans.switch(phase)
                        if phase == "compile":  # the candidate's first call
                            clock.start(now)
                    elif msg[0] == "lock":  # the GPU to itself: timing
                        clock.pause()
                        if reading:  # never wait for the writer lock while holding a read
                            lock.release_read()
                            reading = False
                        spans.switch("wait_timing_lock")
                        lock.acquire_write()
                        spans.switch("timing")
                        locked = True
                        clock.hold()
                        phase, deadline = "timing", time.monotonic() + limits.of("timing")
                        w.conn.send(("go",))
                    elif msg[0] == "unlock":
                        if locked:
                            lock.release_write()
                            locked = False
                        spans.switch("after_timing")
                        clock.release()
                    elif msg[0] == "read":  # shared GPU work; the wait does not count against the phase
                        if lock is not None and not reading and not locked:
                            t0 = time.monotonic()
                            clock.pause()
                            was = spans.switch("wait_read")
                            lock.acquire_read()
                            spans.switch(was)
                            reading = True
                            clock.resume()
                            deadline += time.monotonic() - t0
                        w.conn.send(("go",))
                    elif msg[0] == "unread":
                        if reading:
                            lock.release_read()
                            reading = False
                    elif msg[0] == "regrant":  # the worker capped itself at its measured need
                        budget = self._budgets.get(gpu if w.kind == "cuda" else "cpu")
                        if held is not None and budget is not None and held[0] is not None:
                            held[0] = regranted = budget.shrink(held[0], int(msg[1]))
                    elif msg[0] == "peak":  # the reference's measured peak, before the candidate runs
                        self._note_peak((job.problem.id, bool(job.small)), int(msg[1]))
                    elif msg[0] == "reference":  # computed before the candidate was loaded
                        w.ref_digests[msg[1]] = msg[2]
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
