"""kernellab: a multi-agent research system that makes PyTorch models faster by writing, checking,
tuning and profiling GPU kernels. See README.md and docs/ARCHITECTURE.md.

Python API: ``run`` (a campaign over a file, a Problem or a model), ``load_best`` (the winner's
``ModelNew`` class), ``load_problem``, ``Problem.from_module``; ``kernellab.export`` writes the winner's file;
``optimize`` (a whole model: its subgraphs' campaigns and the patched model) and ``patch``."""

from __future__ import annotations

import os as _os

import torch as _torch

# Without a CUDA device Triton kernels can only run in its interpreter, and Triton reads the switch
# when a kernel is defined: set it before anything here imports triton, so that a winner loaded in
# the process that ran its campaign (run, then load_best) is defined like every other kernel.
# A TRITON_INTERPRET the user set is left as it is.
_interpreter_chosen = "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available()
if _interpreter_chosen:
    _os.environ["TRITON_INTERPRET"] = "1"

from ._astlock import install as _install_ast_lock  # noqa: E402

_install_ast_lock()

# the module kernellab.optimize is callable: kernellab.optimize(model, inputs) runs optimize.optimize
from . import optimize  # noqa: E402
from .campaign import run  # noqa: E402
from .export import load_best  # noqa: E402
from .optimize import patch  # noqa: E402
from .problem import Problem, ProblemError, load_problem  # noqa: E402

__version__ = "0.1.0"
__all__ = ["Problem", "ProblemError", "load_problem", "load_best", "run", "optimize", "patch", "__version__"]
