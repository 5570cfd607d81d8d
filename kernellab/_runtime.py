"""The process-wide settings kernellab's work needs, made in one explicit call: :func:`setup`.

Importing kernellab changes nothing in the process (``import kernellab.vocab`` does not even import torch);
the entry points that run kernellab's work call :func:`setup` first: the CLI, campaigns (``run``,
``run_campaign``), ``load_best`` and ``export``, ``optimize`` and ``patch``, the demo, and the sandbox's
worker, profiling and Inductor-seed processes at their start. It is idempotent and cheap after the first call.

- Without a CUDA device Triton kernels can only run in its interpreter, and Triton reads the switch when a
  kernel is defined (``@triton.jit``): ``TRITON_INTERPRET=1`` is set before any kernel of ours is defined, so
  that a winner loaded in the process that ran its campaign (``run``, then ``load_best``) is defined like
  every other kernel. A ``TRITON_INTERPRET`` the user set is left as it is.
- ``ast.parse`` goes behind one re-entrant lock (:mod:`kernellab._astlock`): the campaign graph's threads
  parse sources, and two conversions at once can fail (python/cpython#106905)."""

from __future__ import annotations

import os
import threading
import time

from kernellab import _astlock

_LOCK = threading.Lock()
_done = False
# True when setup set TRITON_INTERPRET itself (no CUDA device, the user had not set it): load_best says so
interpreter_chosen = False


def setup() -> None:
    """Make the process ready for kernellab's work, once (later calls return at once)."""
    global _done, interpreter_chosen
    if _done:
        return
    with _LOCK:
        if _done:
            return
        if "TRITON_INTERPRET" not in os.environ:
            import torch

            if not torch.cuda.is_available():
                os.environ["TRITON_INTERPRET"] = "1"
                interpreter_chosen = True
        _astlock.install()
        _done = True


_STAMPS: dict[str, float] = {}


def process_age() -> float:
    """Seconds since this process started (Linux: ``/proc``; elsewhere since kernellab was imported)."""
    try:
        with open("/proc/self/stat") as f:
            started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
        with open("/proc/uptime") as f:
            return round(float(f.read().split()[0]) - started, 3)
    except (OSError, ValueError, IndexError):
        return round(time.monotonic() - _IMPORTED, 3)


def stamp(name: str, first: bool = False) -> None:
    """The process's age now under ``name``: where a command's start-up went before its first step (a
    campaign's ``session`` event carries them as ``startup_age_s``; a solo run on the H200 began its first
    step 9.2 s after the process did). ``first``: a command begins, an earlier one's stamps are dropped."""
    if first:
        _STAMPS.clear()
    _STAMPS[name] = process_age()


def stamps() -> dict[str, float]:
    return dict(_STAMPS)


_IMPORTED = time.monotonic()
