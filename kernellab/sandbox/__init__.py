"""kernellab.sandbox: evaluate candidate kernels safely and honestly.

The judge of everything kernellab claims. Candidate code runs only in sandbox worker processes
(scrubbed environment, private temporary directory, per-phase time limits, replaced after a crash);
each evaluation checks correctness on fresh inputs from several distributions, runs integrity checks
against reward hacking, times the candidate against eager PyTorch interleaved in the same process,
and records how much of the time ran in the candidate's own kernels.

- :func:`evaluate` -- one candidate, one result dict (:data:`RESULT_KEYS`);
- ``executor.submit(EvalJob(...))`` -- the way to evaluate many (campaigns, Optuna trials);
- :func:`profile` -- Nsight Compute metrics of a candidate's kernels.
"""

from __future__ import annotations

from typing import Any

from kernellab.problem import Problem

from ._executor import EvalJob, Executor, Limits, LocalExecutor, SandboxError, default_executor
from ._profile import ProfileResult, profile, run_gated
from ._result import KERNEL_WIN_SHARE, RESULT_KEYS, STATUSES, SandboxUnavailable, is_infra

__all__ = ["KERNEL_WIN_SHARE", "evaluate", "profile", "EvalJob", "Executor", "LocalExecutor", "Limits", "default_executor",
           "SandboxError", "SandboxUnavailable", "ProfileResult", "run_gated", "RESULT_KEYS", "STATUSES", "is_infra"]


def evaluate(problem: Problem, source: str, *, config: dict | None = None, small: bool | None = None,
             device: str | None = None, trials: int = 5, timing: bool = True, store: Any = None,
             executor: Executor | None = None, limits: Limits | None = None, timing_target_ms: float | None = None,
             stop_above_ms: float | None = None) -> dict:
    """Evaluate one candidate ``source`` against ``problem`` in a sandbox worker and return its
    result dict (keys :data:`RESULT_KEYS`; ``status`` one of :data:`STATUSES`).

    ``small=None`` uses the problem's SMALL sizes on the CPU and full sizes on CUDA; ``device=None``
    picks CUDA when available. ``store`` caches the torch.compile baseline. ``executor`` defaults to
    the process-wide :func:`default_executor`. ``timing_target_ms`` and ``stop_above_ms``: a cheaper
    timing and an early stop, as on :class:`EvalJob`. ``details.gpu_s`` is what the evaluation cost
    the device (defined in ``kernellab.sandbox._result``). Raises :class:`SandboxError` for bad
    arguments only; whatever the candidate does becomes a status."""
    if trials < 1:
        raise SandboxError("trials must be at least 1")
    ex = executor or default_executor()
    job = EvalJob(problem=problem, source=source, config=config, small=small, device=device, trials=trials,
                  timing=timing, store=store, limits=limits, timing_target_ms=timing_target_ms,
                  stop_above_ms=stop_above_ms)
    return ex.submit(job).result()
