"""The messages between a sandbox worker process and the executor's slot that owns it.

Each message is a tuple sent over the worker's socket (``multiprocessing.connection``, pickled), whose first
item is a :class:`Msg` and the rest its arguments. ``Msg`` is a ``str`` enum so that a message compares equal
to its bare name (``Msg.GO == "go"``) and its members print as that name: a worker and an executor of the same
checkout pickle and unpickle it by value.

executor -> worker (:data:`TO_WORKER`):

  ``(JOB, spec)``          ``_jobloop``: run this job (a :class:`JobSpec`, read by ``_job.run_job``); answered by RESULT
  ``(GO,)``                ``_jobloop``: the READ or LOCK the worker asked for is granted
  ``(EXIT,)``              ``_slots._Worker.stop``: leave the serve loop and exit

worker -> executor (:data:`TO_EXECUTOR`):

  ``(READY, info)``        ``_worker``: started; ``info`` is the device, versions, memory (read by ``_slots``)
  ``(FAILED, traceback)``  ``_worker.main``: the worker could not start (any first message but READY is a failure)
  ``(PHASE, phase)``       the job entered ``phase`` (a :class:`Phase`): the executor's deadline is its limit
  ``(READ,)`` / ``(UNREAD,)``  take / give up a shared hold of the GPU (reference, trials, compile); READ waits for GO
  ``(LOCK,)`` / ``(UNLOCK,)``  take / give up the GPU's writer lock (timing); LOCK waits for GO
  ``(REGRANT, need)``      ``Worker.regrant``: the job capped itself at ``need`` bytes; the rest of its grant goes back
  ``(PEAK, bytes)``        ``_job``: the reference's peak as the need reads it (``Worker.need_peak``), before the candidate runs (the probe's waiters go)
  ``(REFERENCE, key, digest)``  ``_reference``: the worker now holds reference outputs ``key`` with this digest,
                           reported before any candidate of the job ran (what a later job's reuse is checked against)
  ``(RESULT, result, restart)``  the job's result dict, and whether the worker exits after it

A job's phases and the labels of an executor's threads are a :class:`Phase`, a ``str`` enum alike: what the
worker announces (PHASE), the executor's spans of a job (``details.phase_s``), the limit of each (``Limits.of``),
its timeout's ``error_class`` (``timeout:<phase>``) and its Board's labels (the busy sampler's ``doing``). What
results and the Board's counts hold is ``str(phase)``, a plain string, the name it was before.

``tests/sandbox/test_protocol.py`` checks that every message one side sends is one the other side handles, that
no side sends a bare string, that no phase is a bare string and that every phase the worker announces has a limit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernellab.problem import Problem


class _Named(str, enum.Enum):
    """A ``str`` enum that prints as its bare value, in messages, results, error classes and texts, as when these
    were strings. Not ``enum.StrEnum``: Python 3.10."""

    def __str__(self) -> str:
        return self.value


class Msg(_Named):
    JOB = "job"
    GO = "go"
    EXIT = "exit"
    READY = "ready"
    FAILED = "failed"
    PHASE = "phase"
    READ = "read"
    UNREAD = "unread"
    LOCK = "lock"
    UNLOCK = "unlock"
    REGRANT = "regrant"
    PEAK = "peak"
    REFERENCE = "reference"
    RESULT = "result"


TO_WORKER = frozenset({Msg.JOB, Msg.GO, Msg.EXIT})
TO_EXECUTOR = frozenset(Msg) - TO_WORKER


class Phase(_Named):
    """A job's phase or an executor thread's label (see the module docstring)."""

    # a job's phases, announced by its worker (the executor sets LOAD and TIMING itself too): each has a limit
    REFERENCE = "reference"
    BASELINE = "baseline"
    LOAD = "load"
    COMPILE = "compile"
    CHECK = "check"
    TIMING = "timing"
    FOLLOW = "follow"
    KERNEL_SHARE = "kernel_share"
    # the executor's own spans of a job: its waits for the GPU's lock, and the time after the timing's
    WAIT_READ = "wait_read"
    WAIT_TIMING_LOCK = "wait_timing_lock"
    AFTER_TIMING = "after_timing"
    END = "end"  # closes the last span (a Board label for an instant, never a key of phase_s)
    # what else an executor's thread does: Board labels only
    WORKER_START = "worker_start"
    FREE = "free"
    FINISH = "finish"
    PROBE_WAIT = "probe_wait"
    ADMISSION = "admission"
    EXCLUSIVE_WAIT = "exclusive:wait"
    EXCLUSIVE = "exclusive"
    PROFILE_ADMISSION = "profile:admission"
    PROFILE_HOST = "profile:host"
    PROFILE_WAIT_READ = "profile:wait_read"
    PROFILE_SHARED = "profile:shared"
    PROFILE_WAIT_ALONE = "profile:wait_alone"
    PROFILE_ALONE = "profile:alone"


# the phases a job's deadline follows (``Limits.of``)
ANNOUNCED = frozenset({Phase.REFERENCE, Phase.BASELINE, Phase.LOAD, Phase.COMPILE, Phase.CHECK, Phase.TIMING,
                       Phase.FOLLOW, Phase.KERNEL_SHARE})


# jobs a worker runs before it is replaced by a fresh one (LocalExecutor's max_jobs_per_worker, JobSpec.max_jobs)
MAX_JOBS_PER_WORKER = 50


@dataclass(frozen=True)
class JobSpec:
    """The payload of a JOB message: what ``_jobloop`` tells a worker about one job, read by ``_job.run_job`` and
    the steps it runs (``_reference``, ``_trials``, ``_measure``). Sent pickled; the defaults are written here once.

    ``need_baseline``: this job measures the cached torch.compile baseline; ``time_compile``: a re-timing, which
    compiles and times torch.compile itself; ``gpu_grant_bytes`` / ``regrant_floor_bytes``: the memory grant the
    worker caps its allocator at and the least a regrant keeps; ``side_bytes``: the least the job's own side needs
    besides the reference outputs it keeps on the device (``_gpu.side_need``); ``poison_cap``: bytes of freed memory poisoned
    before a candidate call (None: ``_gpu.POISON_CAP``); ``prepare_only``: no candidate (``EvalJob.prepare``);
    ``reuse_reference`` / ``ref_cache_bytes`` / ``ref_digest``: whether the worker may take the reference outputs
    from its cache, how many bytes it may keep there, and the digest the executor vouches for them by."""

    job_id: str
    problem: Problem
    source: str
    small: bool
    config: dict | None = None
    trials: int = 5
    timing: bool = True
    need_baseline: bool | None = None
    max_jobs: int = MAX_JOBS_PER_WORKER
    timing_target_ms: float | None = None
    stop_above_ms: float | None = None
    time_compile: bool = False
    gpu_grant_bytes: int | None = None
    regrant_floor_bytes: int | None = None
    side_bytes: int | None = None
    poison_cap: int | None = None
    prepare_only: bool = False
    reuse_reference: bool = True
    ref_cache_bytes: int = 0
    ref_digest: str | None = None
