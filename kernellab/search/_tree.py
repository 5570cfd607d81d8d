"""The tree of variants: a read-only view over the store's candidates and evaluations.

A node is a candidate; its parent is the candidate it was made from and ``action`` says how. A node's
*score* is its best correct judged evaluation (``kernellab.vocab.is_judged``: kinds ``full`` and
``retime``, winners' re-timings left out) under the campaign objective, in the order of
``kernellab.vocab.best_key``.

On a machine without a GPU timings are *interpreted* (Triton interpreter on CPU) and carry no speedup.
The search still needs an order, so such a node gets a **surrogate score**, with ``surrogate=True``: the
modelled eager / candidate time of the builtin cost model (``details.modelled``, recorded by the campaign
for candidates the model can read), else ``eager_ms / median_ms`` measured in the same interpreted run. Surrogate scores only steer the search
on CPU; they are never reported as speedups (the store's ``best``/``summary`` never read them).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kernellab.vocab import Status, check_objective
from kernellab.vocab import is_judged as _judged

__all__ = ["Node", "Tree", "score_of"]


def score_of(evaluation: dict, objective: str) -> tuple[float | None, bool]:
    """(score, surrogate) of one evaluation; (None, False) when it is not correct or not timed."""
    if evaluation.get("status") != Status.CORRECT:
        return None, False
    value = evaluation.get(objective)
    if value is not None and not evaluation.get("interpreted"):
        return float(value), False
    # interpreted: the builtin cost model's H200 estimate where the campaign recorded one (the
    # interpreter's own times rank by how Python runs a kernel, not how a GPU does)
    modelled = (evaluation.get("details") or {}).get("modelled") or {}
    if modelled.get("ms") and modelled.get("eager_ms"):
        return float(modelled["eager_ms"]) / float(modelled["ms"]), True
    eager, ms = evaluation.get("eager_ms"), evaluation.get("median_ms")
    if eager and ms:
        return float(eager) / float(ms), True  # never reported: steers the search only
    return None, False


@dataclass(frozen=True)
class Node:
    id: str
    parent_id: str | None
    depth: int
    action: str
    origin: str
    source_hash: str
    parents: tuple[str, ...]  # every parent named by the expansion (two for an evolve crossover)
    children: tuple[str, ...]
    status: str | None  # of the best correct evaluation, else of the latest judged one; None: not evaluated
    error_class: str | None
    score: float | None  # None: failed or not evaluated, so never selected for expansion
    surrogate: bool  # the score is the interpreted eager/median ratio, not a speedup
    best: dict | None  # the evaluation that gives the score
    has_space: bool
    partner: str | None = None  # set on a selection only: the second parent of an evolve crossover


class Tree:
    """Nodes of one (campaign, problem), loaded from ``store`` when built; ``reload()`` re-reads."""

    def __init__(self, store: Any, campaign_id: str, problem_id: str, objective: str = "speedup_eager"):
        check_objective(objective)
        self.store, self.campaign_id, self.problem_id, self.objective = store, campaign_id, problem_id, objective
        self.reload()

    def reload(self) -> Tree:
        rows = self.store.candidates(self.campaign_id, self.problem_id)
        evals: dict[str, list[dict]] = {r["id"]: [] for r in rows}
        for e in self.store.evaluations(campaign_id=self.campaign_id):
            if e["candidate_id"] in evals and _judged(e):
                evals[e["candidate_id"]].append(e)
        kids: dict[str, list[str]] = {r["id"]: [] for r in rows}
        for r in rows:
            if r["parent_id"] in kids:
                kids[r["parent_id"]].append(r["id"])
        self._nodes = {r["id"]: self._node(r, evals[r["id"]], kids[r["id"]]) for r in rows}
        return self

    def _best(self, evals: list[dict]) -> tuple[dict | None, float | None, bool]:
        """(evaluation, score, surrogate) of the best of ``evals``: the score high first, then the median
        time low, ties keep the earlier row (``kernellab.vocab.best_key`` when the score is the objective)."""
        scored = [(e, *score_of(e, self.objective)) for e in evals]
        scored = [t for t in scored if t[1] is not None]
        if not scored:
            return None, None, False
        ms = lambda e: e.get("median_ms") if e.get("median_ms") is not None else float("inf")  # noqa: E731
        return min(scored, key=lambda t: (-t[1], ms(t[0])))

    def _node(self, row: dict, evals: list[dict], kids: list[str]) -> Node:
        best, score, surrogate = self._best(evals)
        shown = best or (evals[-1] if evals else None)
        parents = tuple(row.get("parents") or ([row["parent_id"]] if row["parent_id"] else []))
        return Node(id=row["id"], parent_id=row["parent_id"], depth=row["depth"], action=row["action"] or "",
                    origin=row["origin"], source_hash=row["source_hash"], parents=parents,
                    children=tuple(kids), status=shown["status"] if shown else None,
                    error_class=shown.get("error_class") if shown else None, score=score,
                    surrogate=surrogate, best=best, has_space=bool(row.get("space")))

    # -- reading -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes.values())  # creation order

    def __getitem__(self, node_id: str) -> Node:
        return self._nodes[node_id]

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes

    def roots(self) -> list[Node]:
        return [n for n in self if n.parent_id is None]

    def children(self, node_id: str) -> list[Node]:
        return [self._nodes[c] for c in self._nodes[node_id].children]

    def subtree(self, node_id: str) -> list[Node]:
        out, todo = [], [node_id]
        while todo:
            n = self._nodes[todo.pop(0)]
            out.append(n)
            todo.extend(n.children)
        return out

    def scored(self) -> list[Node]:
        """The nodes a policy may expand: correct and timed, in creation order."""
        return [n for n in self if n.score is not None]

    def best(self) -> Node | None:
        return max(self.scored(), key=lambda n: n.score, default=None)  # first of equals wins
