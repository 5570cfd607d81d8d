"""Selection policies: which nodes of the tree to expand next.

Each policy is a small class with one method, ``select(tree, k) -> list[Node]``: ``k`` nodes to expand
(a node may appear more than once: it is then expanded that many times). Only scored nodes (correct
and timed) are selected; a tree without one gives ``[]``, which means "start from the problem".
Every choice is deterministic for a seed: randomness comes from ``random.Random`` seeded with the
policy seed *and the tree size*, so a resumed campaign makes the same choices as an uninterrupted one.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from ._tree import Node, Tree

__all__ = ["Greedy", "Beam", "UCT", "Evolve", "POLICIES", "get_policy"]


def _ranked(nodes: list[Node]) -> list[Node]:
    return sorted(nodes, key=lambda n: -n.score)  # stable: the earlier of equal scores first


def _fill(ranked: list[Node], k: int) -> list[Node]:
    return [ranked[i % len(ranked)] for i in range(k)] if ranked else []


class Greedy:
    """Best-first: the k best nodes (cycling through them when fewer than k exist)."""

    name = "greedy"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def select(self, tree: Tree, k: int) -> list[Node]:
        return _fill(_ranked(tree.scored()), k)


class Beam:
    """Beam search by depth: the beam is the ``width`` best scored nodes of the deepest level that has
    any; the least-expanded beam members go first, so a level is widened before the next is entered."""

    name = "beam"

    def __init__(self, seed: int = 0, width: int = 4):
        if width < 1:
            raise ValueError(f"beam width must be >= 1, got {width}")
        self.seed, self.width = seed, width

    def select(self, tree: Tree, k: int) -> list[Node]:
        scored = tree.scored()
        if not scored:
            return []
        deepest = max(n.depth for n in scored)
        beam = _ranked([n for n in scored if n.depth == deepest])[: self.width]
        return _fill(sorted(beam, key=lambda n: len(n.children)), k)  # stable: score order among equals


class UCT:
    """Monte-Carlo tree search with UCB1. Every node already in the tree is one finished rollout whose
    reward is ``score / best score`` (so in [0, 1]; a failed node gives 0). Walking down from the
    problem, a node offers its scored children and a "stay" arm (expand the node itself: mean = its own
    reward, pulled once plus once per existing child); the arm with the largest
    ``mean + c * sqrt(ln N / n)`` wins, until "stay" does. Each pick adds a virtual visit along its path
    so that the k picks of one call spread out."""

    name = "uct"

    def __init__(self, seed: int = 0, c: float = math.sqrt(2)):
        if c < 0:
            raise ValueError(f"uct exploration constant must be >= 0, got {c}")
        self.seed, self.c = seed, c

    def select(self, tree: Tree, k: int) -> list[Node]:
        best = tree.best()
        if best is None:
            return []
        top = best.score if best.score > 0 else 1.0
        reward = {n.id: max(n.score, 0.0) / top if n.score is not None else 0.0 for n in tree}
        visits = {n.id: len(tree.subtree(n.id)) for n in tree}
        total = {n.id: sum(reward[m.id] for m in tree.subtree(n.id)) for n in tree}
        stays = {n.id: 1 + len(n.children) for n in tree}
        live = {n.id for n in tree if any(m.score is not None for m in tree.subtree(n.id))}
        rng = random.Random(f"uct:{self.seed}:{len(tree)}")
        picks: list[Node] = []
        for _ in range(k):
            here, path = None, []
            while True:
                arms = [a for a in (tree.children(here.id) if here else tree.roots()) if a.id in live]
                # a failed node can be walked through (a debugged child may live below) but not expanded
                options = [(reward[here.id], stays[here.id], None)] if here and here.score is not None else []
                options += [(total[a.id] / visits[a.id], visits[a.id], a) for a in arms]
                n_all = sum(v for _, v, _ in options)
                ucb = [m + self.c * math.sqrt(math.log(n_all) / v) for m, v, _ in options]
                ties = [i for i, u in enumerate(ucb) if u >= max(ucb) - 1e-12]
                choice = options[ties[0] if len(ties) == 1 else rng.choice(ties)][2]
                if choice is None:
                    break
                here = choice
                path.append(choice)
            picks.append(here)
            stays[here.id] += 1
            for n in path:  # a virtual visit: this pick will add a child below every node on the path
                visits[n.id] += 1
        return picks


class Evolve:
    """Evolution: the population is the ``population`` best nodes; each parent is the winner of a
    tournament of ``tournament`` members drawn from it. With probability ``crossover`` a second
    tournament names a partner (``Node.partner``) for the coder to cross with."""

    name = "evolve"

    def __init__(self, seed: int = 0, population: int = 8, tournament: int = 3, crossover: float = 0.3):
        if population < 1 or tournament < 1 or not 0.0 <= crossover <= 1.0:
            raise ValueError("evolve needs population >= 1, tournament >= 1 and 0 <= crossover <= 1 "
                             f"(got {population}, {tournament}, {crossover})")
        self.seed, self.population, self.tournament, self.crossover = seed, population, tournament, crossover

    def select(self, tree: Tree, k: int) -> list[Node]:
        pop = _ranked(tree.scored())[: self.population]
        if not pop:
            return []
        rng = random.Random(f"evolve:{self.seed}:{len(tree)}")
        rank = {n.id: i for i, n in enumerate(pop)}

        def tournament(exclude: str | None = None) -> Node:
            pool = [n for n in pop if n.id != exclude]
            entrants = rng.sample(pool, min(self.tournament, len(pool)))
            return min(entrants, key=lambda n: rank[n.id])

        picks = []
        for _ in range(k):
            parent = tournament()
            if len(pop) > 1 and rng.random() < self.crossover:
                parent = replace(parent, partner=tournament(exclude=parent.id).id)
            picks.append(parent)
        return picks


POLICIES: dict[str, type] = {p.name: p for p in (Greedy, Beam, UCT, Evolve)}


def get_policy(name: str, seed: int = 0, **options: Any):
    """A policy by name (``--policy``); ``options`` are its keyword arguments (e.g. ``width=4``)."""
    if name not in POLICIES:
        raise ValueError(f"unknown search policy {name!r}; known: {', '.join(POLICIES)}")
    try:
        return POLICIES[name](seed=seed, **options)
    except TypeError as exc:
        raise ValueError(f"bad options for policy {name!r}: {exc}") from None
