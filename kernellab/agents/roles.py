"""The four agent roles and the records they exchange. Both the builtin (rule-based) agents and the
LLM-backed agents implement :class:`Agents`; the LangGraph graph only talks to this interface.

A *context* passed to a role is plain data (dicts from the store), never live objects, so that every
role input can be logged in an ``events`` row and replayed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from kernellab.problem import Problem

__all__ = ["Proposal", "Code", "Diagnosis", "Analysis", "Agents"]


@dataclass
class Proposal:
    """The planner's answer: expand ``parent_id`` (None = start from the problem) with ``idea``."""

    parent_id: str | None
    idea: str
    rationale: str = ""
    expected_gain: float | None = None  # e.g. 1.3 = "expect 1.3x over the parent"
    # builtin agents: the replayable action (a frozen dataclass rendered with ``asdict``)
    action: dict | None = None
    # an evolve-policy crossover names a second parent
    parents: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Code:
    """The coder's answer: one complete candidate file (README.md "A problem, a candidate")."""

    source: str
    action: str  # short human-readable description of the change from the parent
    language: str = "triton"  # triton | cuda | torch
    origin: str = "builtin"  # builtin | llm | human | seed | inductor
    model: str | None = None  # the LLM model name, or "builtin"
    meta: dict = field(default_factory=dict)  # e.g. the builtin's replayable action list


@dataclass
class Diagnosis:
    """The debugger's answer: a fixed source (None = give up on this candidate) and why."""

    source: str | None
    diagnosis: str
    action: str = ""
    meta: dict = field(default_factory=dict)


@dataclass
class Analysis:
    """The profiler-analyst's answer for one candidate."""

    bound: str  # memory | compute | latency | unknown
    pct_of_ceiling: float | None
    evidence: str
    next_ideas: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Agents(Protocol):
    """What the graph needs from a backend. ``tree`` is the list of the problem's candidate rows
    (store dicts) each with an added ``best`` key (its best evaluation dict or None) and
    ``analysis`` key (the analyst's latest Analysis dict or None); ``reference`` is the profile of
    the reference model (``{"ops": [{"name", "ms", "share"}], "eager_ms", "compile_ms"}``).

    Selection happens before planning (the graph: select -> plan): the rows the search policy picked
    for expansion carry ``selected: True``; ``plan`` proposes up to ``k`` expansions of those rows
    (``parent_id`` one of them). An empty tree means "start": propose seeds (``parent_id=None``)."""

    name: str

    def plan(self, problem: Problem, tree: list[dict], k: int, reference: dict) -> list[Proposal]: ...

    def code(self, problem: Problem, proposal: Proposal, parent: dict | None) -> Code: ...

    def debug(self, problem: Problem, candidate: dict, evaluation: dict) -> Diagnosis: ...

    def analyze(self, problem: Problem, candidate: dict, evaluation: dict, metrics: list[dict]) -> Analysis: ...
