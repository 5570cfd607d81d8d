"""The cost model's uses by a campaign where nothing is timed on a GPU, and the reference profile.

- ``model_candidate``: an interpreted (CPU) evaluation's modelled H200 time (``modelled_ms``),
  stored in the evaluation's ``details.modelled``; the search tree scores such a node by
  ``eager_ms / ms`` of the model (a surrogate: never reported as a speedup).
- ``config_variants``: children that change one tuning parameter of a selected node to another of
  its ``SPACE`` choices (a ``SetConfig`` action), best modelled first: the search keeps exploring
  when the planner has no action left for a node.
- ``reference_profile``: the reference op by op as the cost model sees it, for ``plan``'s Amdahl
  ranking when no measured profile is at hand.
"""

from __future__ import annotations

import ast
import math
from typing import Any

from kernellab.compiler.codegen import allow_tf32
from kernellab.compiler.cost import Modelled, eager_profile, floor_seconds, model_built
from kernellab.problem import Problem

from ..roles import Proposal
from .actions import SetConfig
from .build import build, built, graph_of
from .planner import modelled_time

__all__ = ["MODEL", "model_candidate", "modelled_ms", "config_variants", "reference_profile", "literal_config"]

MODEL = "h200-cost-v2"  # names the model in details.modelled, so that a later model's numbers are told apart


def modelled_ms(problem, actions=None, config: dict | None = None) -> Modelled:
    """The modelled H200 time of the builtin candidate that replays ``actions`` under ``config`` (its
    nested ``CONFIG``; None: the generated file's own), and of the eager reference."""
    if config is None:
        tree = ast.parse(build(problem, actions).source)
        config = next((ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                       and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in n.targets)), {})
    return model_built(built(problem, actions), problem.settings(), config)


def literal_config(source: str) -> dict:
    """The module-level ``CONFIG`` literal of a candidate (read, never executed); {} when absent."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def _merged(base: dict, over: dict | None) -> dict:
    """A nested ``CONFIG`` with a trial's values applied (group entries merged, as the sandbox does)."""
    out = {g: dict(v) if isinstance(v, dict) else v for g, v in base.items()}
    for g, v in (over or {}).items():
        out[g] = {**out[g], **v} if isinstance(out.get(g), dict) and isinstance(v, dict) else v
    return out


def _actions(row: dict) -> list | None:
    acts = (row.get("meta") or {}).get("actions")
    return list(acts) if isinstance(acts, list) else None


def model_candidate(problem: Problem, candidate: dict, result: dict) -> dict | None:
    """``details.modelled`` for a builtin candidate's evaluation; None for one the model cannot read
    (not replayable from an action list, e.g. an LLM's)."""
    acts = _actions(candidate)
    if acts is None:
        return None
    try:
        b = built(problem, acts)
        m = model_built(b, problem.settings(), _merged(literal_config(candidate["source"]), result.get("config")))
        # the planner's model (planner.modelled_time) prices the structural actions (split-K, persistent,
        # one/two-pass rows, split reductions) that model_built does not see; model_built prices warps,
        # stages and vector width. The geometric mean keeps both orders until the two are one model.
        ms = math.sqrt(m.ms * modelled_time(problem, b) * 1e3)
    except Exception:  # a model that cannot read the candidate leaves it to the interpreted surrogate
        return None
    return {"ms": round(ms, 6), "eager_ms": round(m.eager_ms, 6), "model": MODEL}


def _tried(rows: list[dict], parent_id: str) -> set[str]:
    out = set()
    for r in rows:
        acts = _actions(r) or []
        if r.get("parent_id") == parent_id and acts:
            out.add(repr(sorted(acts[-1].items())))
    return out


def config_variants(problem: Problem, rows: list[dict], k: int) -> list[Proposal]:
    """Up to ``k`` one-parameter changes of the selected, correct, builtin nodes (not tried from that
    node before), ranked by modelled time, the fastest first. None of a library-only node: none of its
    kernels ran, so no parameter of theirs changes what runs."""
    settings = problem.settings()
    scored: list[tuple[float, Proposal]] = []
    for row in [r for r in rows if r.get("selected")]:
        acts, space = _actions(row), row.get("space") or {}
        best = row.get("best") or {}
        if acts is None or best.get("status") != "correct" or best.get("library_only") or not isinstance(space, dict):
            continue
        b = built(problem, acts)
        config = _merged(literal_config(row["source"]), best.get("config"))
        base = model_built(b, settings, config).ms
        tried = _tried(rows, row["id"])
        for gid, choices in space.items():
            for name, values in (choices.items() if isinstance(choices, dict) else ()):
                current = (config.get(gid) or {}).get(name)
                for v in values if isinstance(values, list) else ():
                    action = SetConfig(gid, ((name, v),), "tuning variant")
                    if v == current or repr(sorted(action.to_dict().items())) in tried:
                        continue
                    ms = model_built(b, settings, _merged(config, {gid: {name: v}})).ms
                    scored.append((ms, Proposal(row["id"], action.describe(),
                                                f"modelled {ms:.4f} ms against the parent's {base:.4f} ms",
                                                expected_gain=round(base / ms, 3) if ms else None,
                                                action=action.to_dict())))
    scored.sort(key=lambda t: t[0])  # stable: the earlier of equal times first
    return [p for _, p in scored[:k]]


def reference_profile(problem: Problem) -> dict[str, Any]:
    """The reference op by op on the H200 as the cost model sees it (``cost.eager_profile`` of the
    captured graph): ``{"ops": [...], "eager_ms", "modelled": True}``; {} when capture fails."""
    try:
        graph = graph_of(problem)
    except Exception:
        return {}
    st = problem.settings()
    return eager_profile(graph, allow_tf32(st["dtype"], st["atol"], st["rtol"]))


def floor_ms(problem: Problem) -> float | None:
    """The problem's floor at its own sizes (``cost.floor_seconds`` of the captured graph), in ms;
    None when capture fails or the graph holds an op the floor cannot count."""
    try:
        s = floor_seconds(graph_of(problem))
    except Exception:
        return None
    return None if s is None else s * 1e3
