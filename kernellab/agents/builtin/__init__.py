"""The builtin agents: the offline default backend and the seed generator of LLM campaigns.

capture (``capture.py``: torch.export / make_fx at two sizes) -> lowering to pointwise / reduction /
GEMM IR (``lower.py``) -> fusion groups (``partition.py``) -> one Triton kernel per group
(``loopgen.py`` for pointwise and row reductions, ``gemm.py`` templates for GEMMs) in one candidate
file (``codegen.py``); replayable actions (``actions.py``) make every candidate its parent plus one
action; the action space with the cost model's expected gains in ``planner.py``; rule-based roles in
``agents.py``.
"""

from __future__ import annotations

from .actions import (
    Action,
    Fuse,
    KeepRowOut,
    LibraryGemm,
    Persistent,
    Precision,
    ReductionMode,
    SetConfig,
    Split,
    SplitK,
    SplitRows,
    State,
    ToTorch,
    action_from_dict,
)
from .agents import BuiltinAgents, candidate_actions, profile_reference, seed
from .build import build, built, graph_of
from .capture import CaptureError, capture
from .codegen import TF32_MIN_TOL, allow_tf32
from .partition import Group, Options, partition
from .planner import Applicable, applicable_actions, modelled_time

__all__ = [
    "BuiltinAgents", "seed", "build", "built", "graph_of", "capture", "CaptureError", "partition", "Group",
    "Options", "candidate_actions", "profile_reference", "allow_tf32", "TF32_MIN_TOL", "Action", "State",
    "Split", "Fuse", "ToTorch", "LibraryGemm", "KeepRowOut", "ReductionMode", "SplitK", "SplitRows", "Persistent",
    "Precision", "SetConfig", "action_from_dict", "Applicable", "applicable_actions", "modelled_time",
]
