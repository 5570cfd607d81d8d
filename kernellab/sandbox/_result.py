"""The result record of one evaluation and the mapping from failures to (status, error_class).

Every evaluation, whatever happened, ends as one dict with exactly :data:`RESULT_KEYS` (the
``evaluations`` columns of the store (store/_schema.py) plus ``error_class``, ``versions``, ``config`` and ``details``).

``details`` keys other parts rely on:

- ``gpu_s`` (float, on every result, whatever its status): the device seconds the evaluation cost,
  what ``--gpu-budget`` counts. Measured by the executor on its own monotonic clock, from the worker's
  messages, as ``lock_s + run_s`` (both also in ``gpu_s_parts``):

  * ``lock_s`` -- wall seconds the job held its GPU's timing lock (CUDA only): from the moment the
    lock was granted to the worker's release, summed over grants -- the timing with its side-stream
    check and, for the one job per (problem, device, versions) that measures it, the torch.compile
    baseline timing. Waiting for the lock is not counted.
  * ``run_s`` -- wall seconds from the candidate's first call (the start of the ``compile`` phase)
    until the worker returned its result, or died, or was killed at a time limit, excluding the
    ``lock_s`` periods and waits for the lock: the correctness trials and their integrity checks,
    the outputs-follow-inputs check, the kernel-share profile, and on the CPU the whole timing.
    On the CPU this is the seconds the worker spent running the candidate (with the interleaved
    eager reference while timing).

  Not counted: starting a worker, building the reference outputs, executing the candidate's module,
  compiling the torch.compile baseline. So a candidate that fails to load costs 0.0, and one that
  hangs costs its time limit.
- ``infra`` (True, only on infrastructure failures): the evaluation failed in kernellab's own
  machinery, not in the candidate -- an out-of-memory while building the reference, poisoning,
  comparing or timing the baseline (``error_class`` ``infra:oom``), a job larger than the device's
  memory budget (``infra:too_big``), a worker that could not start (``worker_start``; with
  ``breaker: True`` once the executor stopped trying), a bug of ours (``sandbox``), a shutdown
  (``shutdown``). Status ``crash`` (the status list is fixed), but never the candidate's verdict:
  see :func:`is_infra`. The executor retries such a job (``_gpu.retry_admission``) before answering:
  ``retried_after`` (the first failure's ``error_class``/``error_text``) and ``retries`` (each earlier
  attempt's ``error_class``, ``grant_bytes``, ``alone``, ``peak_bytes``, ``peak_reserved_bytes``, ``gpu_s``,
  ``phase_s``).
- ``memory`` (dict, when the job was admitted to a device budget): ``need_bytes`` (the estimate it
  was admitted with, None when unknown), ``grant_bytes``, ``budget_bytes``, ``admission_wait_s``,
  ``alone`` (ran with no other job on the device), ``alone_reason`` (``no estimate``, ``need > the
  budget``, ``retry after <error_class>``; None when shared), ``reference_peak_bytes`` (CUDA: the reference's measured peak), ``peak_bytes`` (CUDA: the
  job's peak ``max_memory_allocated``), ``peak_reserved_bytes`` (CUDA: its ``max_memory_reserved``, what the
  grant's cap counts), ``regrant_bytes`` (CUDA: the grant the job kept once its reference
  peak was measured, when that was less), ``probe`` (the job measured an unmeasured problem's peak while
  the problem's other jobs waited) and ``probe_wait_s`` (how long this job waited for such a probe).
- ``early_stopped`` (bool, when timing ran): True when ``EvalJob.stop_above_ms`` stopped the timing
  after its first repetitions; ``median_ms``/``p20_ms``/``p80_ms``/``eager_ms`` then cover those only.
- ``timing``: per callable (``candidate``, ``eager``) ``median_ms``, ``p20_ms``, ``p80_ms``, ``reps``
  (timed repetitions), ``planned_reps``, ``estimate_ms``, ``early_stopped``; and ``method``,
  ``target_ms`` (``EvalJob.timing_target_ms``; None for the full timing), ``stop_above_ms``.
"""

from __future__ import annotations

import re
import traceback
from typing import Any

from kernellab.vocab import KERNEL_WIN_SHARE, STATUSES  # noqa: F401 - the sandbox exports them as its own

from ._protocol import Phase

RESULT_KEYS = ("status", "error_text", "error_class", "max_abs_err", "max_rel_err", "median_ms", "p20_ms",
               "p80_ms", "eager_ms", "compile_ms", "speedup_eager", "speedup_compile", "own_kernel_share",
               "library_only", "interpreted", "device", "versions", "config", "details")

# Error text is stored in the database and fed to debugging agents: the tail is what matters.
MAX_ERROR_TEXT = 4000

# Messages of faults after which a CUDA context is unusable: the worker must be replaced.
_CUDA_FAULT = re.compile(
    r"illegal memory access|unspecified launch failure|misaligned address|illegal instruction|"
    r"device-side assert|CUDA_ERROR_ILLEGAL_ADDRESS|CUDA_ERROR_LAUNCH_FAILED|cudaErrorIllegalAddress|"
    r"cudaErrorLaunchFailure|CUDA_ERROR_MISALIGNED_ADDRESS|an illegal instruction|hardware stack error|"
    r"CUDA_ERROR_ASSERT|uncorrectable ECC", re.I)
_OOM = re.compile(r"out of memory|can't allocate memory|cannot allocate memory|CUDA_ERROR_OUT_OF_MEMORY|"
                  r"cudaErrorMemoryAllocation", re.I)


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot evaluate anything any more (its workers do not start: the circuit breaker
    is open, or it was shut down). A campaign stops on it, saved and resumable."""


class Rejected(Exception):
    """An integrity check failed: ``error_class`` is ``integrity:<reason>``."""

    def __init__(self, reason: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.reason = reason
        self.details = details


class Incorrect(Exception):
    """Outputs do not match the reference (wrong values, NaN/Inf, count, shape or dtype)."""

    def __init__(self, error_class: str, message: str, **details: Any) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.details = details


def empty_result(config: dict | None = None) -> dict[str, Any]:
    r: dict[str, Any] = {k: None for k in RESULT_KEYS}
    r["config"] = dict(config or {})
    r["details"] = {"gpu_s": 0.0}  # the executor replaces it with what the job measurably cost
    r["library_only"] = None
    return r


INFRA_PREFIX = "infra:"
# error classes the executor answers with itself: none of them says anything about the candidate
INFRA_CLASSES = ("shutdown", "worker_start", "sandbox")


def is_infra(result: dict) -> bool:
    """Whether ``result`` is an infrastructure failure (``details.infra``), not a verdict on the
    candidate: never store it as the candidate's evaluation, never hand it to a debugger."""
    cls = result.get("error_class") or ""
    return bool((result.get("details") or {}).get("infra")) or cls.startswith(INFRA_PREFIX) or cls in INFRA_CLASSES


def infra_result(config: dict | None, error_class: str, text: str, **details: Any) -> dict[str, Any]:
    r = empty_result(config)
    r.update(status="crash", error_class=error_class, error_text=truncate(text))
    r["details"].update(infra=True, **details)
    return r


def is_oom(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or bool(
        _OOM.search(f"{type(exc).__name__}: {exc}"))


def truncate(text: str, n: int = MAX_ERROR_TEXT) -> str:
    if len(text) <= n:
        return text
    return "...[truncated]...\n" + text[-n:]


def classify(exc: BaseException, phase: str) -> tuple[str, str, bool]:
    """(status, error_class, worker_must_restart) for an exception raised by candidate code.

    ``phase`` is ``load`` (executing the module, building ``ModelNew``), ``compile`` (the first call,
    where Triton and NVRTC compile) or a later phase. Compilation failures are ``compile_error``
    whenever they surface, since Triton and CuPy compile lazily at the first launch.
    """
    name = type(exc).__name__
    mod = type(exc).__module__ or ""
    text = f"{name}: {exc}"
    if _CUDA_FAULT.search(text):
        return "crash", "cuda_fault", True
    if name == "CompilationError" and mod.startswith("triton"):
        return "compile_error", "triton_compile", False
    if name == "CompileException" and "cupy" in mod:
        return "compile_error", "nvrtc", False
    if name == "InterpreterError" and mod.startswith("triton") and phase == Phase.COMPILE and isinstance(
            exc.__cause__, (AttributeError, NameError, TypeError)):
        # The interpreter runs kernels as Python: what the GPU compiler rejects (an unknown `tl.`
        # function, a wrong argument) surfaces at the first call as a Python error; same status as on a GPU.
        return "compile_error", "triton_compile", False
    if name in ("OutOfResources",) and mod.startswith("triton"):
        return "runtime_error", "out_of_resources", False
    if isinstance(exc, MemoryError) or name == "OutOfMemoryError" or _OOM.search(text):
        # A CUDA OOM leaves the context usable, but the candidate's module globals may pin memory.
        return "runtime_error", "oom", True
    if phase == Phase.LOAD:
        if isinstance(exc, SyntaxError):
            return "compile_error", "syntax", False
        if isinstance(exc, ImportError):
            return "compile_error", "import", False
        return "compile_error", "load", False
    return "runtime_error", "exception", False


def format_exc(exc: BaseException) -> str:
    return truncate("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def reference_key(problem_id: str, small: bool, trials: int, timing: bool) -> str:
    """What a job's reference outputs depend on (beyond the worker's device and software): the key of
    ``sandbox._reference._References`` in a worker and of the digests the executor keeps per worker."""
    return f"{problem_id}:{int(bool(small))}:{max(1, int(trials))}:{int(bool(timing))}"
