"""capture -> actions -> partition -> codegen: ``build(problem, actions) -> Code``.

The captured graph is cached per problem content hash (capturing costs seconds: two torch.export
runs); everything after it is cheap and deterministic, so replaying an action list always gives the
same source.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kernellab._tracing import TRACE_LOCK
from kernellab.compiler.capture import capture
from kernellab.compiler.codegen import generate
from kernellab.compiler.ir import Graph
from kernellab.compiler.partition import Group, partition
from kernellab.problem import Problem

from ..roles import Code
from .actions import Action, State, action_from_dict

__all__ = ["build", "Built", "built", "graph_of", "as_actions"]

_CACHE: dict[str, Graph] = {}
_LOCK = threading.Lock()


def graph_of(problem: Problem) -> Graph:
    """The problem's captured graph (cached; callers get a private copy)."""
    with _LOCK:
        g = _CACHE.get(problem.id)
    if g is None:
        with TRACE_LOCK:  # one capture at a time: a thread that waited for another's finds the graph cached
            with _LOCK:
                g = _CACHE.get(problem.id)
            if g is None:
                g = capture(problem)
                with _LOCK:
                    _CACHE[problem.id] = g
    return copy.deepcopy(g)


def as_actions(actions: Iterable[Action | dict] | None) -> list[Action]:
    out = []
    for a in actions or ():
        out.append(a if isinstance(a, Action) else action_from_dict(a))
    return out


@dataclass
class Built:
    graph: Graph
    groups: list[Group]
    state: State
    actions: list[Action]


def built(problem: Problem, actions: Iterable[Action | dict] | None = None) -> Built:
    """The graph, groups and state after replaying ``actions`` (no source generated)."""
    acts = as_actions(actions)
    graph = graph_of(problem)
    state = State()
    for a in acts:
        state = a.apply(state)
    groups = partition(graph, state.options)
    return Built(graph, groups, state, acts)


def build(problem: Problem, actions: Iterable[Action | dict] | None = None) -> Code:
    """The candidate that replays ``actions`` from the seed; its ``meta["actions"]`` is the list."""
    b = built(problem, actions)
    settings = problem.settings()
    labels = [a.describe() for a in b.actions]
    source, meta = generate(problem.name, problem.source, b.graph, b.groups, settings,
                            b.state.variants_dict(), labels)
    meta: dict[str, Any] = {"actions": [a.to_dict() for a in b.actions], **meta}
    return Code(source=source, action=labels[-1] if labels else "seed: fused Triton kernels",
                language="triton", origin="builtin", model="builtin", meta=meta)
