"""kernellab: a multi-agent research system that makes PyTorch models faster by writing, checking,
tuning and profiling GPU kernels. See README.md and docs/ARCHITECTURE.md.

Python API: ``run`` (a campaign over a file, a Problem or a model), ``load_best`` (the winner's
``ModelNew`` class), ``load_problem``, ``Problem.from_module``; ``kernellab.export`` writes the winner's file;
``optimize`` (a whole model: its subgraphs' campaigns and the patched model) and ``patch``.

This module only re-exports, lazily (PEP 562): importing ``kernellab`` or one of its light modules
(``kernellab.vocab``) imports nothing else and changes nothing in the process. The process-wide settings
(the Triton interpreter without a CUDA device, the ``ast.parse`` lock) are made by
``kernellab._runtime.setup()``, which the entry points (the CLI, ``run``, ``load_best``, ``optimize``, ...)
call."""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"
__all__ = ["Problem", "ProblemError", "load_problem", "load_best", "run", "optimize", "patch", "__version__"]

# public name -> (module, attribute); None: the module itself. kernellab.optimize is the function
# (kernellab.wholemodel.optimize); its stages are the package kernellab.wholemodel
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "Problem": ("kernellab.problem", "Problem"),
    "ProblemError": ("kernellab.problem", "ProblemError"),
    "load_problem": ("kernellab.problem", "load_problem"),
    "load_best": ("kernellab.export", "load_best"),
    "run": ("kernellab.campaign", "run"),
    "optimize": ("kernellab.wholemodel", "optimize"),
    "patch": ("kernellab.wholemodel", "patch"),
}


def __getattr__(name: str):
    if name in _EXPORTS:
        module, attr = _EXPORTS[name]
        value = importlib.import_module(module)
        if attr is not None:
            value = getattr(value, attr)
        globals()[name] = value  # once: later lookups do not come here
        return value
    # a submodule not imported yet (``kernellab.export.export``, ``kernellab.campaign``): the eager package of
    # earlier versions had them all loaded, so attribute access still reaches them
    if not name.startswith("__") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
