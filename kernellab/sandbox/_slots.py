"""The pool's slots and the worker processes they own: start-up, the circuit breaker, the pool's size.

A slot is a thread of the executor's process that owns one worker process (:class:`_Worker`, its parent-side
handle) and takes jobs off its device kind's queue one at a time; :class:`_Slots` is the part of
:class:`~kernellab.sandbox.LocalExecutor` that starts slots and workers, stops trying on a device after
``BREAKER_FAILURES`` failed starts in a row, and sizes a GPU's memory budget from the first worker's report.
Kept apart from the admission (``_admission``) and the job's message loop (``_jobloop``): what a slot does with
a job is theirs, how a worker comes to exist is this module's.

The mixin reads the executor's state that ``LocalExecutor.__init__`` sets: ``_lock``, ``_queues``, ``_threads``,
``_gpus``, ``workers_per_gpu``, ``cpu_workers``, ``limits``, ``cpu_memory_gb``, ``_closed``, ``_workers``,
``_start_failures``, ``start_attempts``, ``_budgets``, ``board`` (what each slot is doing: ``_gpu.Board``); a slot
hands each job to ``_evaluate`` (``_admission``) and its result to ``_finish`` (``_jobloop``).
"""

from __future__ import annotations

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
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path

from ._api import Limits
from ._env import protect_parent, worker_env
from ._gpu import GIB, MAX_BYPASS, MemoryBudget
from ._protocol import Msg, Phase
from ._result import infra_result, truncate


def _visible_gpus() -> list[str]:
    from kernellab.env import has_cuda

    if not has_cuda():
        return []
    import torch

    n = torch.cuda.device_count()
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in vis.split(",") if v.strip()] if vis else [str(i) for i in range(n)]
    return ids[:n]


def nvml_budget(gpu: str, workers: int) -> int | None:
    """A GPU's memory budget (:func:`gpu_budget`) as the first worker will report it, from the card's size read
    through NVML without a CUDA context in this process; None where NVML cannot tell."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(int(gpu)) if gpu.isdigit() else pynvml.nvmlDeviceGetHandleByUUID(gpu)
            total = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no package, no driver: the caller waits for a worker's report
        return None
    return gpu_budget(total, workers)


def gpu_budget(total: int, workers: int) -> int:
    """A GPU's memory budget from its size: CUDA contexts (one per worker) and fragmentation live outside the
    allocator's count."""
    return max(GIB, int(total) - (GPU_MARGIN + workers * CONTEXT_BYTES))


class _Worker:
    """Parent-side handle of one worker process."""

    def __init__(self, kind: str, gpu: str | None, limits: Limits, cpu_memory_gb: float | None) -> None:
        self.home = tempfile.mkdtemp(prefix="kernellab-worker-")
        self.kind = kind
        extra = {"KERNELLAB_SANDBOX_DEVICE": kind}
        if kind == "cuda":
            extra["CUDA_VISIBLE_DEVICES"] = gpu or "0"
            # Inductor compiles in the worker itself, where _compilers.release_for_compiles sees its Triton
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
        # reference outputs this worker holds (sandbox._reference._References), by key: the digest it reported
        # when it computed them, before that job's candidate ran -- what a later job's reuse is checked against
        self.ref_digests: dict[str, str] = {}
        deadline = time.monotonic() + limits.startup
        while not self.conn.poll(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_tail(0)
                self.kill()
                raise RuntimeError(f"sandbox worker failed to start (exit {self.proc.returncode}): {tail}")
        msg = self.conn.recv()
        if msg[0] != Msg.READY:  # Msg.FAILED (its traceback), or anything else
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

    def signal_kill(self) -> None:
        """SIGKILL to the worker's process group, not waited for (:func:`kill_all` reaps many at once)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self) -> None:
        self.signal_kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # pragma: no cover
            pass
        self.close()

    def stop(self) -> None:
        try:
            self.conn.send((Msg.EXIT,))
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


def kill_all(workers: list[_Worker]) -> None:
    """Kill ``workers`` together: every one signalled, then each reaped. A killed CUDA process takes about
    a second to tear its context down; one after another, the eight workers of an H200 host held a
    campaign's exit for 9 s."""
    for w in workers:
        w.signal_kill()
    for w in workers:
        w.kill()


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

class JobQueue:
    """A device kind's queue of ``(job, future)`` items in submission order. A free slot takes the first job
    that can start now (``ready``: its memory is free and no probe of its problem is running, see
    ``_Admission._starts_now``) rather than the oldest, and while none can, it waits with the jobs still queued:
    a slot holds its worker while its job waits in admission, and on the H200 a bench of KernelBench's 6.4 GB
    elementwise problems had 5 of its 8 slots waiting there (session 18) while the jobs behind them waited for
    a slot. A job that ``max_pass`` later ones went past is taken when a slot is free, ready or not (it then
    waits in admission, where the budget's own bypass bound holds the others back), so no wait is unbounded.
    Readiness changes when memory is released, which this queue is not told of: a waiting slot looks again
    every ``poll`` seconds. The stop marker is never passed over: it goes only from the head; once the queue is
    closed (the executor shuts down) jobs go in order, and an empty queue gives the stop marker."""

    def __init__(self, max_pass: int = MAX_BYPASS, poll: float = 0.2) -> None:
        self.max_pass, self.poll = max_pass, poll
        self._items: list = []
        self._passed: list[int] = []
        self._cond = threading.Condition()
        self._closed = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def put(self, item: object) -> None:
        with self._cond:
            self._items.append(item)
            self._passed.append(0)
            self._cond.notify_all()

    def get(self, ready: Callable[[object], bool] | None = None) -> object:
        with self._cond:
            while True:
                i = self._pick(ready)
                if i is not None:
                    return self._take(i)
                if self._closed and not self._items:
                    return _SENTINEL
                self._cond.wait(self.poll if self._items else None)

    def get_nowait(self) -> object:
        with self._cond:
            if not self._items:
                raise queue.Empty
            return self._take(0)

    def qsize(self) -> int:
        with self._cond:
            return len(self._items)

    def _pick(self, ready: Callable[[object], bool] | None) -> int | None:
        if not self._items:
            return None
        if ready is None or self._closed or self._items[0] is _SENTINEL:
            return 0
        for i, item in enumerate(self._items):
            if item is _SENTINEL:
                return None  # the jobs before it go first
            if self._passed[i] >= self.max_pass:
                return i
            try:
                if ready(item):
                    return i
            except Exception:  # a bug in the readiness rule must not strand a job: it is taken in turn
                return i
        return None

    def _take(self, i: int) -> object:
        for k in range(i):
            self._passed[k] += 1
        del self._passed[i]
        return self._items.pop(i)


class _Slots:
    """Slot threads and worker starts of :class:`~kernellab.sandbox.LocalExecutor` (see the module docstring)."""

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
                self.board.set(Phase.WORKER_START)
                worker, start_error = self._start_worker(kind, gpu, start_error)
            self.board.set(Phase.FREE)
            item = q.get(lambda it, kind=kind, gpu=gpu: self._starts_now(it[0], kind, gpu))
            if item is _SENTINEL:
                break
            job, fut = item
            if worker is None and not self._closed and not self._breaker_open(kind, gpu):
                self.board.set(Phase.WORKER_START)
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
            self.board.set(Phase.FINISH)
            self._finish(job, fut, result, worker)
        self.board.set(None)
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
                self._budgets[gpu] = MemoryBudget(gpu_budget(total, self.workers_per_gpu))
        return w, start_error
