"""What a caller hands an executor and what it gets back: the public types of the sandbox's executors.

:class:`EvalJob` (one evaluation) with its :class:`Limits` (seconds per phase), :func:`check_job` (what every
executor checks of a job it is given), :class:`Executor` (the two methods a local or a distributed executor
implements), :class:`SandboxError` (a job that cannot be evaluated as asked) and :class:`ProfileGate` (the hold
of a GPU an Nsight Compute run gets from ``LocalExecutor.profiling``). They live apart from the executors so
that ``_dask`` and the pool's own modules (``_slots``, ``_admission``, ``_jobloop``) import them without
importing :class:`~kernellab.sandbox.LocalExecutor`; ``kernellab.sandbox`` and ``_executor`` re-export them.
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kernellab.problem import Problem

from ._gpu import Board, RWLock
from ._protocol import Phase


class SandboxError(ValueError):
    """A job that cannot be evaluated as asked (bad arguments, no such device)."""


@dataclass(frozen=True)
class Limits:
    """Seconds allowed per phase. ``load`` covers executing the candidate's
    module, ``compile`` its first call (Triton/NVRTC compile there), ``check`` the remaining trials,
    ``timing`` the timed runs (waiting for the GPU's timing lock is not counted), ``baseline`` the
    one-off torch.compile of the reference, ``reference`` the reference's outputs for every trial; ``follow``
    and ``kernel_share`` have the ``check`` limit (:attr:`SHARED`), and so would any other phase."""

    load: float = 120.0
    reference: float = 300.0
    compile: float = 300.0
    check: float = 300.0
    timing: float = 300.0
    baseline: float = 900.0
    startup: float = 300.0
    # phases with no field of their own: every announced phase is a field or here (tests/sandbox/test_protocol.py)
    SHARED: ClassVar[dict[str, str]] = {Phase.FOLLOW: "check", Phase.KERNEL_SHARE: "check"}

    def of(self, phase: str) -> float:
        name = str(phase)
        return float(getattr(self, self.SHARED.get(name, name), self.check))


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

    def warm(self, device: str | None = None, *, profile: bool = False) -> None:
        """Start workers ahead of the first job (with ``profile``, what a profile needs too), where the executor
        can (default: nothing to do)."""
        return None

    # What a campaign and a tuner ask of any executor; the defaults are an executor with no GPU of its own here.
    def prepare(self, problem: Problem, *, small: bool | None = None, device: str | None = None, trials: int = 5,
                store: Any = None) -> cf.Future | None:
        """Compute ``problem``'s reference outputs and torch.compile baseline ahead, in a job of their own, where
        the executor can (a future), else None (default: nothing ahead)."""
        return None

    @contextlib.contextmanager
    def profiling(self, problem: Problem | None = None, small: bool = False, gpu: str | None = None):
        """Hold a GPU of this host for a process that uses it (Nsight Compute, the Inductor seed's compile) the
        way a job holds it; yields a :class:`ProfileGate` (``gate.gpu`` None: no GPU held, the default)."""
        yield ProfileGate(None, None)

    def remote_profile(self, problem: Problem, source: str, config: dict | None = None,
                       small: bool = False) -> Any:
        """Nsight Compute where the executor's GPUs are (a cluster's worker), or None when they are on this
        host and the caller profiles here under :meth:`profiling` (the default)."""
        return None

    def runs_here(self) -> bool:
        """Whether its workers run on this host's devices and software, so that a result recorded on this host
        stands for one it would compute (a campaign reuses earlier evaluations only then; default False)."""
        return False

    def gpu_state(self) -> dict | None:
        """Now: what each of its GPUs is held for and what its threads are doing (``held``, ``doing``, ``queued``:
        what a bench's busy sampler files the GPU's utilization under), or None where it cannot say (the default)."""
        return None

    def slots(self, device: str) -> int:
        """How many jobs for ``device`` ("cpu" or "cuda") run at once on one device (a tuner sizes its batches
        by it; default 1)."""
        return 1

    def map(self, jobs: list[EvalJob]) -> list[dict]:
        futures = [self.submit(j) for j in jobs]
        return [f.result() for f in futures]

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()



class ProfileGate:
    """One profiling run's hold of its GPU: none while the profiled process starts (imports under ncu take
    seconds of CPU only), :meth:`share` once it builds the problem on the GPU and warms up (a job's
    correctness work holds the GPU alike), :meth:`exclusive` around the profiled forward. A reader's hold
    held through that start-up stalled every timing, and, phase-fair, every reader queued behind the
    timing: in a 6-job bench on the H200 each tuning's re-timings waited out a whole profile (15-20 s).
    ``targets``: the executor's Nsight Compute targets started ahead (:class:`kernellab.sandbox._profile.WarmTargets`),
    which ``sandbox.profile`` takes one of where it can."""

    def __init__(self, gpu: str | None, lock: RWLock | None, board: Board | None = None, targets: Any = None) -> None:
        self.gpu, self._lock, self._mode, self._board = gpu, lock, None, board
        self.targets = targets
        self.seconds: dict[str, float] = {}  # the run's phases, as sandbox.profile's gated run saw them
        self._say(Phase.PROFILE_HOST)

    def _say(self, label: Phase | None) -> None:
        if self._board is not None:
            self._board.set(label)

    def share(self) -> None:
        if self._lock is not None and self._mode is None:
            self._say(Phase.PROFILE_WAIT_READ)
            self._lock.acquire_read(long=True)  # seconds under ncu (or a compiler), a few milliseconds of kernels
            self._mode = "read"
            self._say(Phase.PROFILE_SHARED)

    def unshare(self) -> None:
        """The process does host-only work (a compiler) for a while: its share given up until :meth:`share`."""
        if self._mode == "read":
            self._lock.release_read(long=True)
            self._mode = None
            self._say(Phase.PROFILE_HOST)

    @contextlib.contextmanager
    def exclusive(self):
        if self._lock is None:
            yield
            return
        if self._mode == "read":
            self._lock.release_read(long=True)  # never wait for the writer lock while holding a read
            self._mode = None
        self._say(Phase.PROFILE_WAIT_ALONE)
        self._lock.acquire_write()
        self._mode = "write"
        self._say(Phase.PROFILE_ALONE)
        try:
            yield
        finally:
            self._lock.release_write()
            self._mode = None
            self._say(Phase.PROFILE_HOST)

    def close(self) -> None:
        if self._mode == "read":
            self._lock.release_read(long=True)
        self._mode = None
