"""The campaign graph (LangGraph): select -> plan -> code (fan-out) -> evaluate -> (debug -> evaluate)*
-> tune -> profile -> analyze -> select ... until a budget or a stop rule ends each problem.

The **store is the source of truth**; the graph state only carries control flow (which problem, which
round, what was selected and proposed). Every node derives its work from the store (e.g. ``evaluate``
evaluates every candidate of the problem that has no judged evaluation yet), and every write is
idempotent (content-hash ids). So a campaign killed at any moment and resumed from its last LangGraph
checkpoint re-runs at most the interrupted node, finds the finished work in the store, and neither
repeats nor loses an evaluation.
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

from kernellab.agents.roles import Agents, Proposal
from kernellab.sandbox import SandboxUnavailable, is_infra
from kernellab.store import is_winner_retime
from langgraph.graph import END, START, StateGraph
from langgraph.types import RetryPolicy, Send

from kernellab.problem import Problem

FAILED = ("compile_error", "runtime_error", "timeout", "crash", "incorrect", "rejected")
# Infrastructure failures (the sandbox's own machinery, see kernellab.sandbox.is_infra) are never a
# candidate's judged evaluation: they are an ``infra`` event and the candidate is evaluated again at
# the next evaluate step, at most this many times per session (a resumed campaign tries again).
MAX_INFRA = 2


class CampaignState(TypedDict, total=False):
    problem_ids: list[str]
    index: int  # the problem being worked on
    round: int  # expansion rounds done on that problem
    selected: list[str | None]
    proposals: list[dict]
    elapsed_s: float  # active wall time over all sessions (between checkpoints)
    n_before: int  # the problem's candidate count when the round started
    empty_rounds: int  # consecutive rounds that added no candidate
    coded: Annotated[list[str], operator.add]
    done: bool


class CodeTask(TypedDict):
    problem_id: str
    proposal: dict


@dataclass
class Context:
    """Live objects the nodes use (not part of the checkpointed state)."""

    store: Any
    campaign_id: str
    config: dict
    problems: dict[str, Problem]
    agents: Agents
    evaluate_many: Callable[[Problem, list[dict]], Any]  # yields (candidate_id, result)
    select: Callable[[Any, int], list[Any]]  # (tree, k) -> nodes
    make_tree: Callable[[str], Any]  # problem_id -> search tree
    stop_check: Callable[[str, CampaignState], str | None]  # -> reason to stop this problem
    tune: Callable[[Problem, dict], dict | None] | None = None
    profile: Callable[[Problem, dict, dict], tuple[list, str | None]] | None = None
    reference: Callable[[Problem], dict] = lambda p: {}
    progress: Any = None
    # errors that must stop the campaign (saved, resumable), e.g. an LLM budget spent; all other
    # errors of an agent step are recorded as events and cost only that step
    fatal: tuple[type[BaseException], ...] = ()
    session_start: float = field(default_factory=time.monotonic)
    infra_failures: dict[str, int] = field(default_factory=dict)  # candidate id -> this session's count

    def event(self, kind: str, payload: dict) -> None:
        self.store.add_event(self.campaign_id, kind, payload)


def _tree_rows(ctx: Context, problem_id: str, selected: list[str | None] | None = None) -> list[dict]:
    """Candidate rows with ``best`` (best judged evaluation), ``analysis`` and ``selected`` keys."""
    store = ctx.store
    objective = ctx.config.get("objective", "speedup_eager")
    analyses = {}
    for ev in store.events(ctx.campaign_id, "analyze"):
        analyses[ev["payload"].get("candidate_id")] = ev["payload"]
    by_candidate: dict[str, list[dict]] = {}
    # one query for the campaign, not one per candidate: plan reads the tree at every step
    for e in store.evaluations(campaign_id=ctx.campaign_id):
        if e["kind"] in ("full", "retime") and not is_winner_retime(e):
            by_candidate.setdefault(e["candidate_id"], []).append(e)
    rows = []
    for c in store.candidates(ctx.campaign_id, problem_id):
        evals = by_candidate.get(c["id"], [])
        correct = [e for e in evals if e["status"] == "correct"]
        best = None
        if correct:
            best = max(correct, key=lambda e: (e[objective] is not None, e[objective] or 0.0, -(e["median_ms"] or 0.0)))
        elif evals:
            best = evals[0]
        c["best"] = best
        c["analysis"] = analyses.get(c["id"])
        c["selected"] = bool(selected) and c["id"] in selected
        rows.append(c)
    return rows


def _failure_cause(ctx: Context, problem_id: str) -> str | None:
    """Why a problem has no correct candidate, for its stop reason (None when it has one or none was
    judged): a stop that says only "nothing new" or "budget" would hide that every candidate timed out."""
    cands = ctx.store.candidates(ctx.campaign_id, problem_id)
    if not cands:  # the planner or the coder failed: their error is in an event, say it here
        errors = [e["payload"]["error"] for kind in ("plan", "code") for e in ctx.store.events(ctx.campaign_id, kind)
                  if e["payload"].get("problem_id") == problem_id and e["payload"].get("error")]
        return f"no candidate was written ({errors[-1][:300]})" if errors else None
    fulls = [e for c in cands for e in ctx.store.evaluations(candidate_id=c["id"]) if e["kind"] == "full"]
    if not fulls or any(e["status"] == "correct" for e in fulls):
        return None
    if all(e["status"] == "timeout" for e in fulls):
        return f"every candidate timed out ({fulls[-1].get('error_text') or fulls[-1].get('error_class')})"
    counts: dict[str, int] = {}
    for e in fulls:
        key = e.get("error_class") or e["status"]
        counts[key] = counts.get(key, 0) + 1
    return "no candidate was correct (" + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())) + ")"


def _remaining(ctx: Context, problem_id: str) -> int:
    return max(0, int(ctx.config["budget"]) - len(ctx.store.candidates(ctx.campaign_id, problem_id)))


def build_graph(ctx: Context) -> StateGraph:
    width = int(ctx.config.get("width", 4))
    max_debug = int(ctx.config.get("debug_rounds", 3))

    def tick(state: CampaignState) -> float:
        now = time.monotonic()
        spent = now - ctx.session_start
        ctx.session_start = now
        return float(state.get("elapsed_s", 0.0)) + spent

    def pid_of(state: CampaignState) -> str:
        return state["problem_ids"][state.get("index", 0)]

    # -- select --------------------------------------------------------------------------------
    def select(state: CampaignState) -> dict:
        elapsed = tick(state)
        index = state.get("index", 0)
        rnd = state.get("round", 0)
        while index < len(state["problem_ids"]):
            pid = state["problem_ids"][index]
            probe = {**state, "index": index, "round": rnd, "elapsed_s": elapsed}
            reason = ctx.stop_check(pid, probe)
            if reason is None and state.get("empty_rounds", 0) >= 2 and index == state.get("index", 0):
                reason = "no new candidate in 2 rounds: the planner and coder proposed nothing new"
            if reason is None:
                break
            cause = _failure_cause(ctx, pid)
            if cause:
                reason = f"{reason}; {cause}"
            ctx.event("stop", {"problem_id": pid, "problem": ctx.problems[pid].name, "reason": reason,
                               "round": rnd, "elapsed_s": round(elapsed, 3)})
            index, rnd = index + 1, 0
            state = {**state, "empty_rounds": 0}
            if ctx.progress:
                ctx.progress.update(problems_done=index)
        if index >= len(state["problem_ids"]):
            return {"index": index, "round": rnd, "elapsed_s": elapsed, "done": True, "selected": [], "proposals": [],
                    "empty_rounds": 0}
        pid = state["problem_ids"][index]
        tree = ctx.make_tree(pid)
        k = min(width, _remaining(ctx, pid))
        nodes = ctx.select(tree, k) if len(ctx.store.candidates(ctx.campaign_id, pid)) else []
        selected = [getattr(n, "id", n) for n in nodes] or [None]
        ctx.event("select", {"problem_id": pid, "round": rnd, "selected": selected,
                             "policy": ctx.config.get("policy")})
        if ctx.progress:
            ctx.progress.update(problem=ctx.problems[pid].name, tree_size=len(tree) if hasattr(tree, "__len__") else 0)
        return {"index": index, "round": rnd, "elapsed_s": elapsed, "done": False, "selected": selected,
                "n_before": len(ctx.store.candidates(ctx.campaign_id, pid)),
                "empty_rounds": state.get("empty_rounds", 0)}

    # -- plan ----------------------------------------------------------------------------------
    def plan(state: CampaignState) -> dict:
        pid = pid_of(state)
        problem = ctx.problems[pid]
        selected = [s for s in state.get("selected", []) if s is not None]
        rows = _tree_rows(ctx, pid, selected)
        k = min(width, _remaining(ctx, pid))
        try:
            proposals = ctx.agents.plan(problem, rows, k, ctx.reference(problem))[:k] if k > 0 else []
        except ctx.fatal:
            raise
        except Exception as exc:
            ctx.event("plan", {"problem_id": pid, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            return {"proposals": []}
        ctx.event("plan", {"problem_id": pid, "round": state.get("round", 0),
                           "proposals": [p.to_dict() for p in proposals]})
        return {"proposals": [p.to_dict() for p in proposals]}

    def fan_out(state: CampaignState) -> list[Send] | str:
        props = state.get("proposals") or []
        if not props:
            return "evaluate"
        return [Send("code", {"problem_id": pid_of(state), "proposal": p}) for p in props]

    # -- code (one per proposal, in parallel) --------------------------------------------------
    def code(task: CodeTask) -> dict:
        pid = task["problem_id"]
        problem = ctx.problems[pid]
        prop = Proposal(**task["proposal"])
        parent = ctx.store.get_candidate(prop.parent_id) if prop.parent_id else None
        try:
            out = ctx.agents.code(problem, prop, parent)
        except ctx.fatal:
            raise
        except Exception as exc:  # a coder failure is recorded, never fatal to the campaign
            ctx.event("code", {"problem_id": pid, "proposal": task["proposal"], "error": f"{type(exc).__name__}: {exc}"})
            return {"coded": []}
        cid = ctx.store.add_candidate(
            ctx.campaign_id, pid, out.source, parent_id=prop.parent_id, parents=prop.parents,
            origin=out.origin, model=out.model, action=out.action or prop.idea, language=out.language,
            space=_space_of(out), meta=out.meta)
        ctx.event("code", {"problem_id": pid, "candidate_id": cid, "action": out.action, "idea": prop.idea})
        return {"coded": [cid]}

    # -- evaluate ------------------------------------------------------------------------------
    def evaluate(state: CampaignState) -> dict:
        pid = pid_of(state)
        problem = ctx.problems[pid]
        cands = ctx.store.candidates(ctx.campaign_id, pid)
        todo = [c for c in cands if ctx.infra_failures.get(c["id"], 0) < MAX_INFRA
                and not any(e["kind"] == "full" for e in ctx.store.evaluations(candidate_id=c["id"]))]
        if todo:
            if ctx.progress:  # the tree as coded so far: the panel's budget left counts these
                ctx.progress.update(in_flight=len(todo), tree_size=len(cands))
            for cand_id, result in ctx.evaluate_many(problem, todo):
                if is_infra(result):
                    # not the candidate's verdict: no `full` row (so no debugger either), tried again later
                    ctx.infra_failures[cand_id] = ctx.infra_failures.get(cand_id, 0) + 1
                    details = result.get("details") or {}
                    ctx.event("infra", {"candidate_id": cand_id, "error_class": result.get("error_class"),
                                        "error_text": (result.get("error_text") or "")[:2000],
                                        "attempt": ctx.infra_failures[cand_id]})
                    if details.get("breaker") or result.get("error_class") == "shutdown":
                        raise SandboxUnavailable(f"the sandbox cannot evaluate candidates: {result.get('error_text')}")
                    continue
                ctx.store.add_evaluation(cand_id, result, kind="full")
                if ctx.progress:
                    ctx.progress.on_evaluation(result)
                    ctx.progress.update(in_flight=max(0, ctx.progress.stats.in_flight - 1),
                                        last=f"{cand_id[:10]} {result['status']}")
        return {}

    def debuggable(pid: str) -> list[tuple[dict, dict]]:
        tried = {e["payload"].get("candidate_id") for e in ctx.store.events(ctx.campaign_id, "debug")}
        out = []
        for c in ctx.store.candidates(ctx.campaign_id, pid):
            if c["id"] in tried or (c.get("meta") or {}).get("debug_round", 0) >= max_debug:
                continue
            full = [e for e in ctx.store.evaluations(candidate_id=c["id"]) if e["kind"] == "full"]
            if full and full[0]["status"] in FAILED:
                out.append((c, full[0]))
        return out

    def after_evaluate(state: CampaignState) -> str:
        pid = pid_of(state)
        return "debug" if max_debug > 0 and _remaining(ctx, pid) > 0 and debuggable(pid) else "tune"

    # -- debug ---------------------------------------------------------------------------------
    def debug(state: CampaignState) -> dict:
        pid = pid_of(state)
        problem = ctx.problems[pid]
        for cand, ev in debuggable(pid):
            if _remaining(ctx, pid) <= 0:
                break
            try:
                fix = ctx.agents.debug(problem, cand, ev)
            except ctx.fatal:
                raise
            except Exception as exc:
                ctx.event("debug", {"candidate_id": cand["id"], "error": f"{type(exc).__name__}: {exc}"})
                continue
            payload = {"candidate_id": cand["id"], "status": ev["status"], "diagnosis": fix.diagnosis}
            if fix.source:
                meta = {**(fix.meta or {}), "debug_round": (cand.get("meta") or {}).get("debug_round", 0) + 1,
                        "debug_of": cand["id"]}
                new_id = ctx.store.add_candidate(
                    ctx.campaign_id, pid, fix.source, parent_id=cand["id"], origin=cand["origin"],
                    model=cand["model"], action=fix.action or f"debug: {fix.diagnosis[:80]}",
                    language=cand["language"], space=_space_from_source(fix.source), meta=meta)
                payload["fixed_candidate_id"] = new_id
            ctx.event("debug", payload)
        return {}

    # -- tune, profile, analyze ----------------------------------------------------------------
    def tune(state: CampaignState) -> dict:
        if ctx.tune is None:
            return {}
        pid = pid_of(state)
        problem = ctx.problems[pid]
        done = {e["payload"].get("candidate_id") for e in ctx.store.events(ctx.campaign_id, "tune")}
        for c in ctx.store.candidates(ctx.campaign_id, pid):
            if c["id"] in done or not c.get("space"):
                continue
            full = [e for e in ctx.store.evaluations(candidate_id=c["id"]) if e["kind"] == "full"]
            if not full or full[0]["status"] != "correct":
                continue
            try:
                summary = ctx.tune(problem, c) or {}
            except ctx.fatal:
                raise
            except Exception as exc:  # a space the tuner cannot read costs the tuning, not the campaign
                summary = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            ctx.event("tune", {"candidate_id": c["id"], **summary})
        return {}

    def best_of(pid: str) -> dict | None:
        rows = ctx.store.reported_best(ctx.campaign_id, pid, ctx.config.get("objective", "speedup_eager"))
        return rows[0] if rows else None

    def profile(state: CampaignState) -> dict:
        pid = pid_of(state)
        best = best_of(pid)
        if ctx.profile is None or best is None:
            return {}
        cand = ctx.store.get_candidate(best["candidate_id"])
        if ctx.store.evaluations(candidate_id=cand["id"], kind="profile") or any(
                e["payload"].get("candidate_id") == cand["id"] for e in ctx.store.events(ctx.campaign_id, "profile")):
            return {}
        metrics, why_not = ctx.profile(ctx.problems[pid], cand, best)
        if metrics:
            ctx.store.add_evaluation(cand["id"], {"status": "correct", "config": best.get("config"),
                                                  "device": best.get("device")}, kind="profile", metrics=metrics)
        ctx.event("profile", {"candidate_id": cand["id"], "metrics": len(metrics), "skipped": why_not})
        return {}

    def analyze(state: CampaignState) -> dict:
        pid = pid_of(state)
        best = best_of(pid)
        if best is not None and not any(e["payload"].get("candidate_id") == best["candidate_id"]
                                        for e in ctx.store.events(ctx.campaign_id, "analyze")):
            cand = ctx.store.get_candidate(best["candidate_id"])
            prof = ctx.store.evaluations(candidate_id=cand["id"], kind="profile")
            metrics = ctx.store.metrics(prof[-1]["id"]) if prof else []
            try:
                a = ctx.agents.analyze(ctx.problems[pid], cand, best, metrics)
                ctx.event("analyze", {"candidate_id": cand["id"], **a.to_dict()})
            except ctx.fatal:
                raise
            except Exception as exc:
                ctx.event("analyze", {"candidate_id": cand["id"], "error": f"{type(exc).__name__}: {exc}"})
        grew = len(ctx.store.candidates(ctx.campaign_id, pid)) > state.get("n_before", 0)
        return {"round": state.get("round", 0) + 1, "coded": [],
                "empty_rounds": 0 if grew else state.get("empty_rounds", 0) + 1}

    g = StateGraph(CampaignState)
    # one more attempt for a flaky step (e.g. a network hiccup the SDK's own retries did not absorb),
    # never for a spent budget or a replay miss
    retry = RetryPolicy(max_attempts=2, retry_on=lambda exc: not isinstance(exc, ctx.fatal))
    g.add_node("select", select)
    g.add_node("plan", plan, retry_policy=retry)
    g.add_node("code", code, retry_policy=retry)
    g.add_node("evaluate", evaluate)
    g.add_node("debug", debug, retry_policy=retry)
    g.add_node("tune", tune)
    g.add_node("profile", profile)
    g.add_node("analyze", analyze, retry_policy=retry)
    g.add_edge(START, "select")
    g.add_conditional_edges("select", lambda s: END if s.get("done") else "plan", ["plan", END])
    g.add_conditional_edges("plan", fan_out, ["code", "evaluate"])
    g.add_edge("code", "evaluate")
    g.add_conditional_edges("evaluate", after_evaluate, ["debug", "tune"])
    g.add_edge("debug", "evaluate")
    g.add_edge("tune", "profile")
    g.add_edge("profile", "analyze")
    g.add_edge("analyze", "select")
    return g


def _space_of(code: Any) -> dict | None:
    space = (code.meta or {}).get("space")
    return space if space else _space_from_source(code.source)


def _space_from_source(source: str) -> dict | None:
    """Read a literal module-level ``SPACE = {...}`` without executing the (untrusted) source."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SPACE" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return None
            return {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in value.items()} if isinstance(value, dict) else None
    return None
