"""kernellab: a multi-agent research system that makes PyTorch models faster by writing, checking,
tuning and profiling GPU kernels. See README.md and DESIGN.md."""

from __future__ import annotations

from .export import load_best
from .problem import Problem, ProblemError, load_problem

__version__ = "0.1.0"
__all__ = ["Problem", "ProblemError", "load_problem", "load_best", "__version__"]
