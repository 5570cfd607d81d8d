"""A sandbox worker process: ``python -m kernellab.sandbox._worker FD``.

Started by :class:`~kernellab.sandbox.LocalExecutor` with a scrubbed environment, in its own session
(so the whole process group can be killed), inside a private temporary directory, with stdout and
stderr going to a log file whose tail is attached to crash reports. It talks to the executor over
the socket ``FD`` (``multiprocessing.connection`` messages, tuples headed by a ``_protocol.Msg``; that
module lists each message, who sends it and what it means):

  executor -> worker: (JOB, payload) | (GO,) [lock granted] | (EXIT,)
  worker -> executor: (READY, info) | (PHASE, name) | (READ,) | (UNREAD,) | (LOCK,) | (UNLOCK,) | (REGRANT, need)
                      | (PEAK, bytes) | (REFERENCE, key, digest) | (RESULT, dict, restart)

``read``/``unread`` bracket shared GPU work (reference, poison, trials, compile), ``lock``/``unlock``
the timing (the GPU's writer lock: no other job's GPU work runs meanwhile); a worker holding a read
gives it up before asking for the writer lock. The executor enforces the time limit of the phase
announced last; the worker enforces nothing.
"""

from __future__ import annotations

import faulthandler
import functools
import os
import socket
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ._compilers import release_for_compiles
from ._env import drop_inspect_caps
from ._protocol import Msg, Phase


class Worker:
    def __init__(self, conn: Connection) -> None:
        import torch

        self.conn = conn
        self.torch = torch
        self.device_kind = os.environ.get("KERNELLAB_SANDBOX_DEVICE", "cpu")
        self.home = Path.cwd()
        self.jobs = 0
        self.refs_on_device = 0  # the bytes of reference outputs the job in progress keeps on the device
        self._spans: list | None = None  # record_spans
        self._since: float | None = None
        if self.device_kind == "cuda":
            torch.cuda.init()
            self.device = torch.device("cuda", 0)
            self.total_bytes = torch.cuda.get_device_properties(self.device).total_memory
            torch.empty(1, device=self.device)  # create the context now, not in the first job
            from ._timing import L2Flush

            self.flush = L2Flush(self.device)
            # What every job's state snapshot imports (torch._dynamo, torch.profiler: seconds on a cold
            # process), imported here, while the pool starts: paid inside the first job's load phase, 8
            # fresh workers of a pool spent ~4 s each on it (bench_sandbox: load 4.09 s vs 0.52 s).
            from ._guard import _settle_lazy_patches

            t0 = time.perf_counter()
            _settle_lazy_patches()
            self.warmup_s = round(time.perf_counter() - t0, 3)
        else:
            self.device = torch.device("cpu")
            self.flush = None
        try:
            import triton  # noqa: F401  (imported before any candidate, so launches can be counted)
        except Exception:  # pragma: no cover
            pass
        self.reading = False
        self.off = False  # inside off_gpu: the hold given up for host work
        self.main_thread = threading.current_thread()
        if self.device_kind == "cuda":
            release_for_compiles(self.off_gpu, self.on_gpu)
        if self.device_kind != "cuda":
            from ._interp import apply_numpy_shim

            apply_numpy_shim()
        from ._guard import LaunchCounter

        self.counter = LaunchCounter(cupy=self.device_kind == "cuda")  # CuPy runs on a GPU only
        from kernellab.env import device_name, versions

        self.info = {"pid": os.getpid(), "home": str(self.home), "device": device_name(str(self.device)),
                     "versions": versions(), "kind": self.device_kind,
                     "gpu_total_bytes": getattr(self, "total_bytes", None), "warmup_s": getattr(self, "warmup_s", None)}
        self.threads = set(threading.enumerate())

    # -- messaging ---------------------------------------------------------------------------
    def send(self, *msg: Any) -> None:
        self.conn.send(msg)

    def phase(self, name: Phase) -> None:
        self.send(Msg.PHASE, name)

    def read(self) -> None:
        """Wait for a shared hold of the GPU (no timing runs on it while held)."""
        if self.device_kind != "cuda" or self.reading:
            return
        self.send(Msg.READ)
        msg = self.conn.recv()
        if msg[0] != Msg.GO:  # pragma: no cover - protocol error
            raise RuntimeError(f"sandbox protocol: expected go, got {msg[0]}")
        self.reading = True
        if self._spans is not None:
            self._since = time.time()

    def unread(self) -> None:
        if self.reading:
            self.reading = False
            self._span_end()
            self.send(Msg.UNREAD)

    def record_spans(self, into: list | None) -> None:
        """From now (``into`` a list) until called with None: append to ``into`` each wall-clock span this worker
        holds its shared hold of the GPU (a compile's :meth:`off_gpu` stretch ends one and starts the next),
        which is when its GPU work may run: a trial's ``details.trial_windows``."""
        if into is None:
            self._span_end()
            self._spans = None
            return
        self._spans, self._since = into, time.time() if self.reading else None

    def _span_end(self) -> None:
        if self._spans is not None and self._since is not None:
            self._spans.append((self._since, time.time()))
        self._since = None

    def off_gpu(self, fn: Any) -> Any:
        """``fn`` run without this worker's shared hold of the GPU, when it holds one: for host-only work
        (a compiler) inside a job's GPU work. The device is synchronised first, so none of this worker's
        queued kernels runs while a timing has the GPU; the hold is asked for again before ``fn``'s caller
        goes on (to launch what was compiled). Other threads, and a worker holding the timing lock, keep
        what they hold."""

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.reading or threading.current_thread() is not self.main_thread:
                return fn(*args, **kwargs)
            self.torch.cuda.synchronize()
            self.unread()
            self.off = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.off = False
                self.read()

        call._kernellab_off_gpu = True
        return call

    def on_gpu(self, fn: Any) -> Any:
        """``fn`` with the shared hold, asked for again (and given up after, the device synchronised) when it is
        called inside :meth:`off_gpu`: what a compiler runs on the GPU while it compiles (its benchmarks)."""

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self.off or threading.current_thread() is not self.main_thread:
                return fn(*args, **kwargs)
            self.read()
            try:
                return fn(*args, **kwargs)
            finally:
                self.torch.cuda.synchronize()
                self.unread()

        return call

    def limit_gpu_memory(self, grant: int | None) -> None:
        """Cap this process's allocator at the bytes the executor admitted the job with (the whole
        device when the job was admitted without a budget), and start counting its peak."""
        if self.device_kind != "cuda":
            return
        frac = min(1.0, grant / self.total_bytes) if grant else 1.0
        self.torch.cuda.set_per_process_memory_fraction(frac, self.device)
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def need_peak(self) -> int:
        """The job's peak so far as the need reads it (``_gpu.need_peak``)."""
        from ._gpu import need_peak

        return need_peak(int(self.torch.cuda.max_memory_allocated(self.device)), self.refs_on_device)

    def regrant(self, grant: int | None, floor: int | None = None, compile_timed: bool = False,
                side: int | None = None) -> None:
        """After the reference (and the baseline) ran: cap this job's allocator at the need its measured
        reference peak gives (what later jobs of the problem are admitted with), when that is less than
        its grant, and hand the rest back to the executor's budget. The first job of a problem is
        admitted at twice the meta device's estimate, which for KernelBench's Softmax (122.7 GB) kept
        every other job of a 4-job bench waiting for a card it used 54 GB of."""
        if self.device_kind != "cuda" or not grant:
            return
        from ._gpu import regrant_cap

        least = int(side) + self.refs_on_device if side else 0  # the job's own side, and the outputs it keeps here
        need = regrant_cap(self.need_peak(), grant, floor, compile_timed, least)
        if need is not None:
            self.torch.cuda.set_per_process_memory_fraction(min(1.0, need / self.total_bytes), self.device)
            self.send(Msg.REGRANT, need)

    def lock(self) -> None:
        if self.device_kind != "cuda":
            return
        self.reading = False  # the executor gives the read up before it waits for the writer lock
        self.send(Msg.LOCK)
        msg = self.conn.recv()
        if msg[0] != Msg.GO:  # pragma: no cover - protocol error
            raise RuntimeError(f"sandbox protocol: expected go, got {msg[0]}")

    def unlock(self) -> None:
        if self.device_kind == "cuda":
            self.send(Msg.UNLOCK)

    def serve(self) -> None:
        self.send(Msg.READY, self.info)
        while True:
            try:
                msg = self.conn.recv()
            except EOFError:
                return
            if msg[0] == Msg.EXIT:
                return
            if msg[0] != Msg.JOB:  # pragma: no cover
                continue
            from ._job import run_job

            self.jobs += 1
            result, restart = run_job(self, msg[1])
            # Threads the candidate left running could tamper with later jobs: start afresh.
            if set(threading.enumerate()) - self.threads:
                restart = True
                result["details"]["worker_restarted"] = "the candidate left threads running"
            self.send(Msg.RESULT, result, restart)
            if restart:
                return


def _limit_memory() -> None:
    gb = os.environ.get("KERNELLAB_SANDBOX_MEMORY_GB")
    if gb:  # CPU workers only: a runaway allocation fails with MemoryError instead of waking the OOM killer
        import resource

        n = int(float(gb) * (1 << 30))
        resource.setrlimit(resource.RLIMIT_AS, (n, n))


def _watch_parent() -> None:
    """Exit when the executor's process is gone (a hung candidate would otherwise outlive it)."""
    parent = os.getppid()

    def loop() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(3)

    threading.Thread(target=loop, daemon=True, name="kernellab-parent-watch").start()


def main() -> None:
    from kernellab._runtime import setup

    setup()  # what every kernellab process sets before its work (the interpreter switch, the ast lock)
    drop_inspect_caps()
    _limit_memory()
    _watch_parent()
    fd = int(sys.argv[1])
    sock = socket.socket(fileno=fd)
    conn = Connection(os.dup(sock.fileno()))
    sock.close()
    faulthandler.enable(file=sys.stderr, all_threads=True)
    try:
        worker = Worker(conn)
    except Exception:
        conn.send((Msg.FAILED, traceback.format_exc()))
        raise
    try:
        worker.serve()
    finally:
        try:
            conn.close()
        finally:
            # skip interpreter teardown: candidate objects' finalisers may hang or crash
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


if __name__ == "__main__":
    main()
