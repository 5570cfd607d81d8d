"""The builtin compiler: a problem's PyTorch model to one candidate file of Triton kernels.

capture (``capture.py``: torch.export / make_fx at two sizes, sizes solved symbolically) -> the graph IR
(``ir.py``) -> lowering to pointwise / reduction / GEMM / conv nodes (``lowering.py``, one registered function per
ATen op; the expansions in ``decompose.py``) -> fusion groups (``partition.py``) -> one Triton kernel per group
(``kernels/``: ``loopgen.py`` for pointwise and row reductions, the ``gemm.py`` and ``conv.py`` templates,
``special.py``) in one candidate file (``codegen.py``); ``cost.py`` is the H200 roofline and cost model the
planner ranks with.

The compiler knows nothing of agents, campaigns or the sandbox: ``kernellab.agents.builtin`` drives it (its
replayable actions set ``partition.Options`` and per-group variants, ``build.py`` runs capture -> partition ->
codegen)."""

from __future__ import annotations

from .capture import CaptureError, capture
from .codegen import TF32_MIN_TOL, allow_tf32, generate
from .ir import Dyn, Graph, Node, Ref, Sym
from .partition import Group, Options, partition

__all__ = ["capture", "CaptureError", "Graph", "Node", "Ref", "Sym", "Dyn", "partition", "Group", "Options",
           "generate", "allow_tf32", "TF32_MIN_TOL"]
