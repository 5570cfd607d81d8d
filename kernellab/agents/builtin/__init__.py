"""The builtin agents: the offline default backend and the seed generator of LLM campaigns.

They drive the compiler (``kernellab.compiler``: capture -> lowering -> partition -> Triton codegen):
replayable actions (``actions.py``) make every candidate its parent plus one action, ``build.py`` replays
them through the compiler; the action space with the cost model's expected gains in ``planner.py``; the
modelled times of a CPU campaign in ``modelled.py``; the Inductor seed (torch.compile's own output as a
candidate) in ``inductor.py``; rule-based roles in ``agents.py``.
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
from .planner import Applicable, applicable_actions, modelled_time

__all__ = [
    "BuiltinAgents", "seed", "build", "built", "graph_of", "candidate_actions", "profile_reference", "Action", "State",
    "Split", "Fuse", "ToTorch", "LibraryGemm", "KeepRowOut", "ReductionMode", "SplitK", "SplitRows", "Persistent",
    "Precision", "SetConfig", "action_from_dict", "Applicable", "applicable_actions", "modelled_time",
]
