"""The ``kernellab`` command line: each command is a short function over the library.

Exit codes (README.md "Commands"): 0 success, 1 the work failed (e.g. no correct candidate), 2 bad usage or
bad input. ``--json`` on every command prints one JSON document on stdout instead of tables.

The commands live one group a module: ``inspection`` (status, show, lineage, eval), ``campaigns`` (run, resume,
retime, report, export), ``studies`` (bench, study, compare), ``whole`` (optimize), ``worker``; what they share is
``_common``, and ``_main`` is the group. This module only re-exports."""

from __future__ import annotations

from kernellab.cli._common import (
    DEFAULT_DB,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    UsageFailure,
    _finish,
    _interruptible,
    emit,
    resume_hint,
)
from kernellab.cli._main import main

__all__ = ["main", "emit", "resume_hint", "UsageFailure", "DEFAULT_DB", "EXIT_OK", "EXIT_FAILED", "EXIT_USAGE",
           "_finish", "_interruptible"]
