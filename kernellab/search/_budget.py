"""Budgets and stop rules: when a campaign ends. Written in code, not in prompts.

``Budget`` limits candidates, wall time, GPU-seconds, LLM dollars and expansion rounds (whichever ends
first); it is the one place a budget is enforced: the campaign's stop check asks ``check``, and the
graph asks ``candidates_left`` how many candidates a round may still add.
``StopRules`` ends the search early: target speedup reached, plateau, or roofline. ``check`` asks
both; ``stop_reason`` is the campaign's question (its graph records the answer as a ``stop`` event).
"""

from __future__ import annotations

import sys
from dataclasses import asdict, dataclass, field
from typing import Any

from ._tree import Tree

__all__ = ["Budget", "Usage", "StopRules", "StopDecision", "CEILINGS", "pct_of_ceiling", "check",
           "stop_reason"]

# Measured ceilings of the reference GPU (H200, torch 2.11, one run each; kernellab.report.CEILINGS), in bytes/s or
# FLOP/s. float16 was not measured: H200 runs fp16 and bf16 at the same tensor-core rate, so it
# takes bf16's lower measured value.
CEILINGS = {
    "memory": 4.22e12,
    "compute:float32": 51e12,
    "compute:tf32": 355e12,
    "compute:bfloat16": 700e12,
    "compute:float16": 700e12,
}
CEILING_DEVICE = "H200"


def pct_of_ceiling(bound: str, achieved: float, dtype: str = "float32") -> float:
    """Percent (0-100) of the measured ceiling: ``achieved`` is bytes/s for ``memory``, FLOP/s for
    ``compute`` (``dtype`` one of float32, tf32, bfloat16, float16)."""
    key = "memory" if bound == "memory" else f"compute:{dtype}"
    if key not in CEILINGS:
        raise ValueError(f"no measured ceiling for bound {bound!r} and dtype {dtype!r}; known: {', '.join(CEILINGS)}")
    return 100.0 * achieved / CEILINGS[key]


@dataclass(frozen=True)
class StopDecision:
    rule: str  # budget:<a Budget field> | target | plateau | roofline
    reason: str  # one sentence a person can read in `kernellab status`
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """What a campaign has spent. ``wall_s`` and ``rounds`` are the caller's: only the runner knows the
    time it ran (a paused-then-resumed campaign should not pay for the pause) and its rounds."""

    candidates: int = 0
    wall_s: float = 0.0
    gpu_s: float = 0.0
    llm_usd: float = 0.0
    rounds: int = 0  # expansion rounds done on the problem

    @classmethod
    def from_store(cls, store: Any, campaign_id: str, *, wall_s: float = 0.0, rounds: int = 0,
                   problem_id: str | None = None) -> Usage:
        """Candidates and GPU-seconds (the sandbox's ``details.gpu_s`` per evaluation) of the campaign
        (or of one problem in it), LLM dollars of the campaign."""
        cands = {c["id"] for c in store.candidates(campaign_id, problem_id)}
        gpu = sum(float((e.get("details") or {}).get("gpu_s") or 0.0)
                  for e in store.evaluations(campaign_id=campaign_id) if e["candidate_id"] in cands)
        # a replayed call costs nothing now but counts what the original paid, so that a replay under
        # the same dollar budget stops where the original did
        usd = sum(float(c.get("cost_usd") or (c.get("response") or {}).get("replayed_cost_usd") or 0.0)
                  for c in store.llm_calls(campaign_id))
        return cls(candidates=len(cands), wall_s=wall_s, gpu_s=gpu, llm_usd=usd, rounds=rounds)


@dataclass(frozen=True)
class Budget:
    """Limits (None: unlimited); the first one reached ends the campaign."""

    candidates: int | None = None
    wall_s: float | None = None
    gpu_s: float | None = None
    llm_usd: float | None = None
    rounds: int | None = None

    @classmethod
    def of_campaign(cls, config: Any) -> Budget:
        """A campaign's budget from its ``CampaignConfig`` fields (``budget``, ``time_budget_s``,
        ``gpu_budget_s``, ``usd_budget``). LLM dollars are seen twice, for two different ends: here,
        between rounds, a spent budget ends the campaign's problems with a ``budget: llm_usd`` stop;
        the LLM backend refuses a single call that would overspend (``BudgetExceeded``), which stops
        the campaign resumable (``resume --usd-budget``)."""
        get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)  # a dict or a CampaignConfig
        return cls(candidates=get("budget"), wall_s=get("time_budget_s"), gpu_s=get("gpu_budget_s"),
                   llm_usd=get("usd_budget"))

    def candidates_left(self, used: int | Usage) -> int:
        """How many candidates the budget still allows (``sys.maxsize`` when unlimited)."""
        n = used.candidates if isinstance(used, Usage) else int(used)
        return sys.maxsize if self.candidates is None else max(0, int(self.candidates) - n)

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value is not None and value <= 0:
                raise ValueError(f"budget {name} must be > 0 (or None for no limit), got {value}")

    def check(self, usage: Usage) -> StopDecision | None:
        for name, limit in asdict(self).items():
            used = getattr(usage, name)
            if limit is not None and used >= limit:
                return StopDecision(f"budget:{name}", f"budget: {name} spent, {used:g} of {limit:g}",
                                    {"used": used, "limit": limit})
        return None


@dataclass(frozen=True)
class StopRules:
    """Early stops. ``target``: the best speedup reached it (real speedups only: an interpreted
    surrogate never claims a target). ``plateau``: the last ``plateau_window`` expansions raised the
    best score by no more than ``plateau_threshold`` (relative). ``roofline``: the best candidate runs
    at >= this fraction of the measured ceiling of its bound (from the analyst's ``analysis`` events,
    on the device the ceilings were measured on; ``pct_of_ceiling`` is a percentage), or its median is
    within this fraction of ``floor_ms``, the problem's own floor (``compiler.cost.floor_seconds``: its
    compulsory bytes at the measured bandwidth, its FLOPs at the fastest measured rate). The floor
    needs no profile, so a problem whose first candidate already moves its bytes at copy speed stops
    after one round (KernelBench's 20_LeakyReLU, at 101% of it, spent a second round and two more
    tunings to gain nothing)."""

    target: float | None = None
    plateau_window: int | None = 8
    plateau_threshold: float = 0.01
    roofline: float | None = 0.9
    floor_ms: float | None = None

    def __post_init__(self) -> None:
        if self.plateau_window is not None and self.plateau_window < 1:
            raise ValueError(f"plateau_window must be >= 1 (or None), got {self.plateau_window}")
        if self.plateau_threshold < 0:
            raise ValueError(f"plateau_threshold must be >= 0, got {self.plateau_threshold}")
        if self.roofline is not None and not 0 < self.roofline <= 1:
            raise ValueError(f"roofline is a fraction in (0, 1], got {self.roofline}")

    def check(self, tree: Tree) -> StopDecision | None:
        best = tree.best()
        if best is None:
            return None
        real = max((n for n in tree.scored() if not n.surrogate), key=lambda n: n.score, default=None)
        if self.target is not None and real is not None and real.score >= self.target:
            return StopDecision("target", f"target: {tree.objective} {self.target:g}x reached, "
                                f"{real.score:.3g}x by {real.id}",
                                {"candidate_id": real.id, "score": real.score, "target": self.target})
        return self._plateau(tree) or self._roofline(tree, best)

    def _plateau(self, tree: Tree) -> StopDecision | None:
        m = self.plateau_window
        nodes = list(tree)  # creation order = the order of expansions
        if m is None or len(nodes) <= m:
            return None
        before = max((n.score for n in nodes[:-m] if n.score is not None), default=None)
        now = max((n.score for n in nodes if n.score is not None), default=None)
        if before is None or now > before * (1 + self.plateau_threshold):
            return None
        return StopDecision("plateau", f"plateau: the last {m} expansions gained {now / before - 1:+.2%} "
                            f"(threshold {self.plateau_threshold:.0%})",
                            {"window": m, "best_before": before, "best_now": now,
                             "threshold": self.plateau_threshold, "surrogate": tree.best().surrogate})

    def at_floor(self, candidate_id: str, median_ms: float | None, device: str | None) -> StopDecision | None:
        """A GPU median on the device the floor was measured on, within ``roofline`` of ``floor_ms``."""
        if self.roofline is None or not self.floor_ms or not median_ms or CEILING_DEVICE not in str(device or ""):
            return None
        if self.floor_ms < self.roofline * median_ms:
            return None
        return StopDecision("roofline", f"roofline: {candidate_id} runs at {100 * self.floor_ms / median_ms:.0f}% of "
                            f"the problem's floor, {self.floor_ms:.3g} ms (stop at {self.roofline:.0%})",
                            {"candidate_id": candidate_id, "floor_ms": self.floor_ms, "median_ms": median_ms,
                             "pct_of_floor": 100 * self.floor_ms / median_ms})

    def _roofline(self, tree: Tree, best) -> StopDecision | None:
        if self.roofline is None or best.surrogate or CEILING_DEVICE not in str(best.best.get("device") or ""):
            return None
        floor = self.at_floor(best.id, best.best.get("median_ms"), best.best.get("device"))
        if floor:
            return floor
        # the graph records each Analysis flat in an "analyze" event: {candidate_id, bound, pct_of_ceiling, ...}
        analyses = [e["payload"] for e in tree.store.events(tree.campaign_id, kind="analyze")]
        analyses = [a for a in analyses if a.get("candidate_id") == best.id]
        pct = analyses[-1].get("pct_of_ceiling") if analyses else None
        if pct is None or pct < 100 * self.roofline:
            return None
        return StopDecision("roofline", f"roofline: {best.id} runs at {pct:.0f}% of the measured "
                            f"{analyses[-1].get('bound', '?')} ceiling (stop at {self.roofline:.0%})",
                            {"candidate_id": best.id, "pct_of_ceiling": pct, "bound": analyses[-1].get("bound")})


def check(tree: Tree, budget: Budget | None = None, rules: StopRules | None = None,
          usage: Usage | None = None) -> StopDecision | None:
    """The first reason to stop, budgets before rules; None: go on."""
    if budget is not None:
        decision = budget.check(usage or Usage.from_store(tree.store, tree.campaign_id))
        if decision:
            return decision
    return rules.check(tree) if rules is not None else None


def stop_reason(tree: Tree, budget: Budget | None = None, *, store: Any = None, campaign_id: str | None = None,
                elapsed_s: float = 0.0, rounds: int = 0, target: float | None = None, plateau: int | None = 8,
                plateau_gain: float = 0.01, roofline: float | None = 0.9, floor_ms: float | None = None) -> str | None:
    """The campaign runner's question for one problem: why stop (one line), or None. Candidates,
    GPU-seconds and ``rounds`` (expansion rounds done, against ``budget.rounds``) are counted for this
    problem, LLM dollars for the whole campaign; ``plateau`` counts expansions (candidates), not
    rounds. The runner records the reason in its ``stop`` event."""
    store = store if store is not None else tree.store
    usage = Usage.from_store(store, campaign_id or tree.campaign_id, wall_s=elapsed_s, rounds=rounds,
                             problem_id=tree.problem_id)
    rules = StopRules(target=target, plateau_window=plateau or None, plateau_threshold=plateau_gain, roofline=roofline,
                      floor_ms=floor_ms)
    decision = check(tree, budget, rules, usage)
    return decision.reason if decision else None
