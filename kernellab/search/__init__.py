"""Search: the tree of variants, selection policies, Optuna tuning, budgets and stop rules.

Read in this order: ``_tree`` (the tree as a view over the store), ``_policies`` (which nodes to
expand), ``_budget`` (when to stop), ``_reuse`` (results other campaigns measured), ``_tune``
(Optuna over a candidate's ``SPACE``).
"""

from __future__ import annotations

from ._budget import (
                      CEILINGS,
                      Budget,
                      StopDecision,
                      StopRules,
                      Usage,
                      check,
                      pct_of_ceiling,
                      stop_reason,
)
from ._policies import POLICIES, UCT, Beam, Evolve, Greedy, get_policy
from ._reuse import VERSION_KEYS, find_reusable, reused_result
from ._reuse import settings as reuse_settings
from ._tree import Node, Tree, score_of
from ._tune import SpaceError, TuneResult, make_sampler, parse_space, prewarm_storage, read_space, tune

__all__ = ["Tree", "Node", "score_of", "Greedy", "Beam", "UCT", "Evolve", "POLICIES", "get_policy",
           "Budget", "Usage", "StopRules", "StopDecision", "CEILINGS", "pct_of_ceiling", "check",
           "stop_reason", "tune", "prewarm_storage", "parse_space", "read_space", "SpaceError", "TuneResult", "make_sampler",
           "find_reusable", "reused_result", "reuse_settings", "VERSION_KEYS"]
