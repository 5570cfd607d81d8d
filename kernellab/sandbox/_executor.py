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

The pool is split by concern over this package's modules, each a mixin of :class:`LocalExecutor`:
``_slots`` (slot threads, worker processes and their start-up), ``_admission`` (memory admission, the
probe, retries) and ``_jobloop`` (one attempt's messages with its worker, the baseline cache, the result's
speedups); the public types are ``_api``'s. This module holds the executor's state and public methods, and
re-exports what callers import from here.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import contextlib
import itertools
import os
import queue
import threading
import time
from dataclasses import replace
from typing import Any

from kernellab.problem import Problem
from kernellab.vocab import small_for

from ._admission import _Admission
from ._api import EvalJob, Executor, Limits, ProfileGate, SandboxError, check_job
from ._gpu import Board, MemoryBudget, RWLock
from ._jobloop import _JobLoop
from ._protocol import MAX_JOBS_PER_WORKER, Phase
from ._result import infra_result
from ._slots import (
    _SENTINEL,
    JobQueue,
    _Slots,
    _visible_gpus,
    _Worker,
    host_workers_per_gpu,
    kill_all,
    nvml_budget,
    reference_cache_bytes,
)

__all__ = ["Limits", "EvalJob", "Executor", "LocalExecutor", "ProfileGate", "default_executor", "SandboxError"]


class LocalExecutor(_Slots, _Admission, _JobLoop, Executor):
    """A pool of sandbox worker processes on this host (see the module docstring).

    Workers start lazily, on the first job for their device kind, and live across jobs (starting a
    process that imports torch costs seconds); a worker is replaced after ``max_jobs_per_worker``
    jobs or any job that ended in ``timeout``, ``crash`` or ``rejected``.

    Memory: each GPU admits jobs against a byte budget, its total memory minus
    ``GPU_MARGIN + workers_per_gpu * CONTEXT_BYTES`` (CUDA contexts and fragmentation live outside
    the allocator's count), or ``gpu_bytes`` (also read from ``KERNELLAB_GPU_BYTES``) when given --
    which also puts the CPU pool under admission, the way tests exercise it without a GPU. A job's
    need is estimated from the problem on the meta device (admitted at ``_gpu.UNMEASURED_MARGIN`` times the
    estimate) and, once a job of the problem has run on a GPU, from its reference's measured peak;
    its grant caps the worker's allocator (``set_per_process_memory_fraction``), so a runaway
    candidate cannot starve its neighbours."""

    def __init__(self, workers_per_gpu: int | None = None, cpu_workers: int | None = None,
                 limits: Limits | None = None, max_jobs_per_worker: int = MAX_JOBS_PER_WORKER,
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
        from ._reference import HOST_FLOOR_ENV, host_floor_setting

        try:
            host_floor_setting()  # read again by the workers (_reference.host_floor)
        except ValueError:
            raise SandboxError(f"{HOST_FLOOR_ENV} must be a number of bytes >= 0, "
                               f"got {os.environ.get(HOST_FLOOR_ENV)!r}") from None
        if gpu_bytes is not None and gpu_bytes <= 0:
            raise SandboxError(f"gpu_bytes must be a positive number of bytes, got {gpu_bytes!r}")
        self.gpu_bytes = gpu_bytes
        self._queues: dict[str, JobQueue] = {"cuda": JobQueue(), "cpu": JobQueue()}
        self._threads: dict[str, list[threading.Thread]] = {"cuda": [], "cpu": []}
        # per GPU: timing/profiling as writers, correctness work as readers (see _gpu.RWLock)
        self._gpu_locks = {g: RWLock() for g in self._gpus}
        self.board = Board()  # what each slot thread and profile is doing now (gpu_state)
        # per GPU (and "cpu" when gpu_bytes is given): the memory admission; made when the total is known
        self._budgets: dict[str, MemoryBudget] = {}
        if gpu_bytes is not None:
            self._budgets["cpu"] = MemoryBudget(gpu_bytes)
            for g in self._gpus:
                self._budgets[g] = MemoryBudget(gpu_bytes)
        self._estimates: dict[tuple[str, bool], tuple[int, int] | None] = {}
        self._nvml_budgets: dict[str, int | None] = {}  # memory_share's budget before a worker reports it
        self._ref_peaks: dict[tuple[str, bool], int] = {}
        # per problem and kind of job (a re-timing or not): the largest reserved peak but the reference outputs a
        # job kept on the device (_Admission._note_side)
        self._side_peaks: dict[tuple[str, bool, bool], int] = {}
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
        self._profile_targets: Any = None  # WarmTargets, once a campaign that profiles warms the pool
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
            self._queues[kind].close()
            for _ in threads:
                self._queues[kind].put(_SENTINEL)
        if wait:
            # one minute for all the jobs in flight together (a minute each added up to several)
            until = time.monotonic() + 60
            for threads in self._threads.values():
                for t in threads:
                    t.join(timeout=max(0.0, until - time.monotonic()))
        kill_all(list(self._workers))
        if self._profile_targets is not None:
            # after the workers: killed first, an idle target under ncu held their ends 11.6 s on the H200 (the
            # target's own end is not waited for, only ncu's)
            self._profile_targets.close()
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
        self.board.set(Phase.EXCLUSIVE_WAIT)
        try:
            with self._admitted_on(problem, small, gpu) as g:
                with self._gpu_locks[g].write():
                    self.board.set(Phase.EXCLUSIVE)
                    yield g
        finally:
            self.board.set(None)

    @contextlib.contextmanager
    def _admitted_on(self, problem: Problem | None, small: bool, gpu: str | None):
        """A GPU of this executor's (the first when ``gpu`` is None), admitted for ``problem``'s footprint."""
        g = gpu if gpu is not None else self._gpus[0]
        if g not in self._gpu_locks:
            raise SandboxError(f"GPU {g!r} is not one of this executor's ({', '.join(self._gpus)})")
        budget = self._budgets.get(g)
        if budget is None or problem is None:
            yield g
            return
        need, floor = self._need(problem, small, False, budget.budget)
        with budget.admitted(need, floor=floor):
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
        self.board.set(Phase.PROFILE_ADMISSION)
        try:
            with self._admitted_on(problem, small, gpu) as g:
                gate = ProfileGate(g, self._gpu_locks[g], self.board, self._profile_targets)
                try:
                    yield gate
                finally:
                    gate.close()
        finally:
            self.board.set(None)

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

    def runs_here(self) -> bool:
        return True

    def gpu_state(self) -> dict | None:
        """Now: what each GPU is held for (``held``, one label per GPU in this executor's order:
        :meth:`_gpu.RWLock.held`), how many slot threads and profiles are in each phase or wait (``doing``) and
        how many jobs wait for a slot (``queued``): what a bench's sampler files the GPU's utilization under."""
        return {"held": [self._gpu_locks[g].held() for g in self._gpus], "doing": self.board.counts(),
                "queued": self._queues["cuda" if self._gpus else "cpu"].qsize()}

    def memory_share(self, problem: Problem, small: bool | None = None, device: str | None = None,
                     timeout: float = 120.0) -> float | None:
        """The share of its device's memory budget one job of ``problem`` asks for now (what admission would
        grant it: from the meta device's estimate until a job has measured the reference's peak); None when
        unknown: a pool without a budget (the CPU's, unless ``gpu_bytes``) or no estimate. A GPU's budget is
        known once its first worker has reported the card's size: that is waited for, ``timeout`` s at most.
        A bench reads it to run a few of the largest problems at once among smaller ones."""
        kind = self._pool_of(device)
        place = (self._gpus[0] if self._gpus else None) if kind == "cuda" else "cpu"
        budget = self._budgets.get(place) if place is not None else None
        size = budget.budget if budget is not None else None
        if size is None and kind == "cuda" and place is not None:
            # NVML tells at once; a worker's report came 13 s into a bench on the H200, its start held that long
            if place not in self._nvml_budgets:
                self._nvml_budgets[place] = nvml_budget(place, self.workers_per_gpu)
            size = self._nvml_budgets[place]
            if size is None:
                self._ensure_slots(kind)
                deadline = time.monotonic() + timeout
                while place not in self._budgets and not self._closed and time.monotonic() < deadline:
                    time.sleep(0.1)
                size = self._budgets[place].budget if place in self._budgets else None
        if size is None:
            return None
        need, _ = self._need(problem, bool(small_for(kind, small)), False, size)
        return None if need is None else need / size

    def slots(self, device: str) -> int:
        return self.cpu_workers if self._pool_of(device) == "cpu" else self.workers_per_gpu

    def warm(self, device: str | None = None, *, profile: bool = False) -> None:
        """Start ``device``'s workers now, without waiting for them (a campaign calls this as it starts,
        so the pool's start-up overlaps its planning instead of delaying its first evaluation); with ``profile``,
        an Nsight Compute target per GPU too (:class:`~kernellab.sandbox._profile.WarmTargets`: ncu's start, the
        target's imports and context behind the first profile, 10-11 s of a solo campaign's 15 s profile)."""
        if self._closed:
            return
        pool = self._pool_of(device)
        self._ensure_slots(pool)
        if profile and pool == "cuda":
            from ._profile import WarmTargets

            with self._lock:
                if self._profile_targets is None:
                    self._profile_targets = WarmTargets()
            for g in self._gpus:
                self._profile_targets.start(g)

    def _pool_of(self, device: str | None) -> str:
        """The pool ("cuda" or "cpu") a job for ``device`` runs in (None: CUDA when a GPU is visible)."""
        return "cuda" if (device or ("cuda" if self._gpus else "cpu")).startswith("cuda") else "cpu"


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
