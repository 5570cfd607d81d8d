"""The campaign graph (LangGraph): select -> plan -> code (fan-out) -> evaluate -> (debug -> evaluate)*
-> tune -> profile -> analyze -> select ... until a budget or a stop rule ends each problem.

The **store is the source of truth**; the graph state only carries control flow (which problem, which
round, what was selected and proposed). Every node derives its work from the store (e.g. ``evaluate``
evaluates every candidate of the problem that has no judged evaluation yet), and every write is
idempotent (content-hash ids; events keyed by node and LangGraph step, ``event_key``). So a campaign
killed at any moment and resumed from its last LangGraph checkpoint re-runs at most the interrupted
node, finds the finished work in the store, and neither repeats nor loses an evaluation or an event.

The nodes are module-level functions of (state, ``Runtime[Context]``, config), testable one by one;
``build_graph`` only wires them.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime
from langgraph.types import RetryPolicy, Send

from kernellab.agents.roles import Agents, Proposal
from kernellab.problem import Problem, content_hash
from kernellab.sandbox import SandboxUnavailable, is_infra
from kernellab.store import BaseStore, canonical_json
from kernellab.vocab import FAILED, Kind, best_key, is_judged, space_from_source

if TYPE_CHECKING:  # the campaign layer above builds the Context; its config type only is named here
    from kernellab.campaign.config import CampaignConfig

# Infrastructure failures (the sandbox's own machinery, see kernellab.sandbox.is_infra) are never a
# candidate's judged evaluation: they are an ``infra`` event and the candidate is evaluated again at
# the next evaluate step, at most this many times per session (a resumed campaign tries again).
MAX_INFRA = 2
# Errors worth one more attempt of the node (the RetryPolicy's): the store busy beyond its timeout
# ("database is locked"), a dropped connection or a timeout that an agent's SDK did not absorb. Agent
# steps re-raise these to the policy instead of recording them; every other error of an agent step is
# an event and costs only that step, and ``Context.fatal`` stops the campaign (saved, resumable).
TRANSIENT: tuple[type[BaseException], ...] = (sqlite3.OperationalError, ConnectionError, TimeoutError)
# A campaign step that takes at least this long also gets a progress line (every step is a ``step`` event):
# a GPU campaign that went quiet for minutes said nothing of where the time went.
SLOW_STEP_S = 10.0


class CampaignState(TypedDict, total=False):
    problem_ids: list[str]
    index: int  # the problem being worked on
    round: int  # expansion rounds done on that problem
    selected: list[str | None]
    proposals: list[dict]
    elapsed_s: float  # active wall time over all sessions (between checkpoints)
    n_before: int  # the problem's candidate count when the round started
    empty_rounds: int  # consecutive rounds that added no candidate
    done: bool


class CodeTask(TypedDict):
    problem_id: str
    proposal: dict


@dataclass
class Context:
    """What the nodes work with (LangGraph's ``context_schema``: given to ``invoke``, never checkpointed)."""

    store: BaseStore
    campaign_id: str
    config: CampaignConfig  # the campaign's own (frozen): its defaults are CampaignConfig's
    problems: dict[str, Problem]
    agents: Agents
    evaluate_many: Callable[[Problem, list[dict]], Any]  # yields (candidate_id, result)
    select: Callable[[Any, int], list[Any]]  # (tree, k) -> nodes
    make_tree: Callable[[str], Any]  # problem_id -> search tree
    stop_check: Callable[[str, CampaignState], str | None]  # -> reason to stop this problem
    # (problem id, candidate id, its full evaluation) -> why it already runs at the problem's floor, or None
    at_floor: Callable[[str, str, dict], str | None] = lambda pid, cid, evaluation: None
    # (problem, candidate row, deadline: a time.monotonic() value or None) -> the tuning's summary
    tune: Callable[..., dict | None] | None = None
    profile: Callable[[Problem, dict, dict], tuple[list, str | None]] | None = None
    # the reference's profile for the planner's Amdahl ranking ({"ops": [{"name", "ms", "share"}], ...})
    reference: Callable[[Problem], dict] = lambda p: {}
    # an interpreted (CPU) result's modelled H200 time: (problem, candidate row, result) -> details or None
    model: Callable[[Problem, dict, dict], dict | None] | None = None
    # children that change one tuning parameter: (problem, tree rows, k) -> proposals, when the
    # planner proposes fewer than k
    variants: Callable[[Problem, list[dict], int], list[Proposal]] | None = None
    # (problem, candidate row): its evaluation submitted as the code step writes it; evaluate_many collects it
    start_evaluation: Callable[[Problem, dict], None] | None = None
    progress: Any = None
    fatal: tuple[type[BaseException], ...] = ()
    transient: tuple[type[BaseException], ...] = TRANSIENT
    session_start: float = field(default_factory=time.monotonic)
    infra_failures: dict[str, int] = field(default_factory=dict)  # candidate id -> this session's count
    _keys: set[str] | None = field(default=None, repr=False)

    @property
    def passthrough(self) -> tuple[type[BaseException], ...]:
        """Errors an agent step must not swallow: fatal ones and transient ones (for the RetryPolicy)."""
        return (*self.fatal, *self.transient)

    def event(self, kind: str, payload: dict, key: str | None = None) -> bool:
        """Record an ``events`` row; with ``key``, only once per campaign: a node re-run after a resume
        (same campaign, node, step and item) finds its key written and writes nothing. One process
        runs a campaign at a time (campaign_lock), so the keys read once per session stay true."""
        if key is not None:
            if self._keys is None:
                self._keys = {e["payload"].get("event_key") for e in self.store.events(self.campaign_id)} - {None}
            if key in self._keys:
                return False
            payload = {**payload, "event_key": key}
        self.store.add_event(self.campaign_id, kind, payload)
        if key is not None:
            self._keys.add(key)
        return True


@contextlib.contextmanager
def timed_step(ctx: Context, step: str, problem_id: str | None = None, label: str | None = None,
               slow: str | None = None, within: str | None = None, start: str | None = None,
               **fields: Any) -> Iterator[dict]:
    """Time one campaign step: a ``step`` event (``step``, ``label``, ``seconds``, ``problem``; ``within``
    names the step it is part of, so a sum by step counts it once; the body may add fields to the dict
    it gets), and a progress line when it took ``SLOW_STEP_S`` or more (``slow``: its text, e.g.
    "Inductor seed compiled"). Recorded per session, never deduplicated: a step run again after a
    resume cost its time again. A step that raised is recorded with ``error`` (the exception's type), and
    its progress line says it was stopped or failed, never that it was done.
    ``start``: a progress line as the step starts, for steps that can take minutes (a campaign killed
    during one then says which it was in)."""
    extra: dict[str, Any] = {}
    if start and ctx.progress is not None:
        ctx.progress.update(last=start)
    t0 = time.monotonic()
    failure: BaseException | None = None
    try:
        yield extra
    except BaseException as exc:
        failure = exc
        raise
    finally:
        seconds = time.monotonic() - t0
        name = ctx.problems[problem_id].name if problem_id in ctx.problems else None
        payload = {"step": step, "label": label, "within": within, "seconds": round(seconds, 3),
                   "problem_id": problem_id, "problem": name, **fields, **extra}
        if failure is not None:
            payload["error"] = type(failure).__name__
        try:
            ctx.store.add_event(ctx.campaign_id, "step", {k: v for k, v in payload.items() if v is not None})
            if ctx.progress is not None and seconds >= SLOW_STEP_S:
                plain = f"{step} ({label})" if label else step
                if failure is None:
                    line = f"{slow or plain} in {seconds:.0f} s"
                else:  # "tuning of X in 301 s" would read as done: the bench log is read as a record
                    how = "stopped" if isinstance(failure, KeyboardInterrupt) else "failed"  # _interrupt.Stopped too
                    line = f"{start or plain}: {how} after {seconds:.0f} s ({type(failure).__name__})"
                ctx.progress.update(last=line)
        except Exception:  # a measurement must never cost the step (nor hide its own error)
            pass


def event_key(config: RunnableConfig | None, node: str, *item: Any) -> str | None:
    """``node@step[/item]``: the LangGraph step is the same when a node re-runs after a resume (the
    checkpoint before it is where the campaign goes on). None outside a graph run (no dedup)."""
    step = ((config or {}).get("metadata") or {}).get("langgraph_step")
    if step is None:
        return None
    return f"{node}@{step}" + "".join(f"/{i}" for i in item)


def _ctx(runtime: Runtime[Context]) -> Context:
    return runtime.context


def _pid(state: CampaignState) -> str:
    return state["problem_ids"][state.get("index", 0)]


def _width(ctx: Context) -> int:
    return ctx.config.width


def _max_debug(ctx: Context) -> int:
    return ctx.config.debug_rounds


def _tree_rows(ctx: Context, problem_id: str, selected: list[str | None] | None = None) -> list[dict]:
    """Candidate rows with ``best`` (best judged evaluation), ``analysis`` and ``selected`` keys."""
    store = ctx.store
    objective = ctx.config.objective
    analyses = {}
    for ev in store.events(ctx.campaign_id, "analyze"):
        analyses[ev["payload"].get("candidate_id")] = ev["payload"]
    by_candidate: dict[str, list[dict]] = {}
    # one query for the campaign, not one per candidate: plan reads the tree at every step
    for e in store.evaluations(campaign_id=ctx.campaign_id):
        if is_judged(e):
            by_candidate.setdefault(e["candidate_id"], []).append(e)
    rows = []
    for c in store.candidates(ctx.campaign_id, problem_id):
        evals = by_candidate.get(c["id"], [])
        correct = [e for e in evals if e["status"] == "correct"]
        best = None
        if correct:
            best = min(correct, key=best_key(objective))
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
    fulls = [e for c in cands for e in ctx.store.evaluations(candidate_id=c["id"]) if e["kind"] == Kind.FULL]
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
    from kernellab.search import Budget

    return Budget.of_campaign(ctx.config).candidates_left(len(ctx.store.candidates(ctx.campaign_id, problem_id)))


def _tick(ctx: Context, state: CampaignState) -> float:
    now = time.monotonic()
    spent = now - ctx.session_start
    ctx.session_start = now
    return float(state.get("elapsed_s", 0.0)) + spent


def _deadline(ctx: Context, state: CampaignState) -> float | None:
    """When the campaign's time budget (``--time-budget``, active wall time over all sessions) runs out, as a
    ``time.monotonic()`` value; None without one. The select step checks it between rounds; the steps
    inside a round that can take minutes (tuning, profiling) check it too, or a 30 s budget became minutes."""
    wall = ctx.config.time_budget_s
    if wall is None:
        return None
    # the earlier sessions' active time, then this session's from its start
    return ctx.session_start + wall - float(state.get("elapsed_s", 0.0))


def _usage_to_progress(ctx: Context) -> None:
    """The panel's budget and LLM fields, from the store (a resumed campaign's spending included)."""
    if ctx.progress is None:
        return
    calls = ctx.store.llm_calls(ctx.campaign_id)
    # a replayed call counts what the original paid, as the dollar budget does
    usd = sum(float(c.get("cost_usd") or (c.get("response") or {}).get("replayed_cost_usd") or 0.0) for c in calls)
    tokens = sum(int(c.get("input_tokens") or 0) + int(c.get("output_tokens") or 0) for c in calls)
    ctx.progress.update(llm_usd=usd, llm_tokens=tokens, budget_usd=ctx.config.usd_budget)


# -- select ---------------------------------------------------------------------------------------
def _next_problem(ctx: Context, state: CampaignState, elapsed: float, key: str | None) -> tuple[int, int]:
    """The first problem from the current one on that has no reason to stop; a ``stop`` event for each
    passed over. Returns (index, round)."""
    index, rnd = state.get("index", 0), state.get("round", 0)
    empty = state.get("empty_rounds", 0)
    while index < len(state["problem_ids"]):
        pid = state["problem_ids"][index]
        reason = ctx.stop_check(pid, {**state, "index": index, "round": rnd, "elapsed_s": elapsed})
        if reason is None and empty >= 2 and index == state.get("index", 0):
            reason = "no new candidate in 2 rounds: the planner and coder proposed nothing new"
        if reason is None:
            break
        cause = _failure_cause(ctx, pid)
        if cause:
            reason = f"{reason}; {cause}"
        ctx.event("stop", {"problem_id": pid, "problem": ctx.problems[pid].name, "reason": reason,
                           "round": rnd, "elapsed_s": round(elapsed, 3)}, key and f"{key}/{pid}")
        index, rnd, empty = index + 1, 0, 0
        if ctx.progress:
            ctx.progress.update(problems_done=index)
    return index, rnd


def select(state: CampaignState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    """Stop the problems that are done, then let the search policy pick the nodes to expand."""
    ctx = _ctx(runtime)
    elapsed = _tick(ctx, state)
    key = event_key(config, "select")
    _usage_to_progress(ctx)
    index, rnd = _next_problem(ctx, state, elapsed, key)
    if index >= len(state["problem_ids"]):
        return {"index": index, "round": rnd, "elapsed_s": elapsed, "done": True, "selected": [], "proposals": [],
                "empty_rounds": 0}
    pid = state["problem_ids"][index]
    moved = index != state.get("index", 0)
    tree = ctx.make_tree(pid)
    n = len(ctx.store.candidates(ctx.campaign_id, pid))
    k = min(_width(ctx), _remaining(ctx, pid))
    nodes = ctx.select(tree, k) if n else []
    selected = [getattr(x, "id", x) for x in nodes] or [None]
    ctx.event("select", {"problem_id": pid, "round": rnd, "selected": selected, "policy": ctx.config.policy},
              key)
    if ctx.progress:
        ctx.progress.update(problem=ctx.problems[pid].name, tree_size=len(tree) if hasattr(tree, "__len__") else 0)
    return {"index": index, "round": rnd, "elapsed_s": elapsed, "done": False, "selected": selected, "n_before": n,
            "empty_rounds": 0 if moved else state.get("empty_rounds", 0)}


def after_select(state: CampaignState) -> str:
    return END if state.get("done") else "plan"


# -- plan -----------------------------------------------------------------------------------------
def _with_variants(ctx: Context, problem: Problem, rows: list[dict], proposals: list[Proposal],
                   k: int) -> list[Proposal]:
    """Fill up to ``k`` with tuning-parameter variants of the selected nodes (when the planner ran
    out of its own actions), leaving out any the planner proposed itself."""
    if ctx.variants is None or len(proposals) >= k:
        return proposals
    have = {(p.parent_id, repr(p.action)) for p in proposals}
    extra = [p for p in ctx.variants(problem, rows, k) if (p.parent_id, repr(p.action)) not in have]
    return proposals + extra[: k - len(proposals)]


def plan(state: CampaignState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    ctx = _ctx(runtime)
    pid = _pid(state)
    problem = ctx.problems[pid]
    key = event_key(config, "plan")
    rows = _tree_rows(ctx, pid, [s for s in state.get("selected", []) if s is not None])
    k = min(_width(ctx), _remaining(ctx, pid))
    if k <= 0:
        return {"proposals": []}
    try:
        with timed_step(ctx, "plan", pid):
            with timed_step(ctx, "reference", pid, label="reference profile", within="plan",
                            slow="reference profile for the planner"):
                reference = ctx.reference(problem)
            proposals = ctx.agents.plan(problem, rows, k, reference)[:k]
    except ctx.passthrough:
        raise
    except Exception as exc:
        ctx.event("plan", {"problem_id": pid, "error": f"{type(exc).__name__}: {exc}"[:2000]}, key)
        return {"proposals": []}
    n_agent = len(proposals)
    if rows:  # the seeds come from the planner alone
        proposals = _with_variants(ctx, problem, rows, proposals, k)
    out = [p.to_dict() for p in proposals]
    ctx.event("plan", {"problem_id": pid, "round": state.get("round", 0), "proposals": out,
                       "variants": len(out) - n_agent}, key)
    return {"proposals": out}


def fan_out(state: CampaignState) -> list[Send] | str:
    props = state.get("proposals") or []
    if not props:
        return "evaluate"
    return [Send("code", {"problem_id": _pid(state), "proposal": p}) for p in props]


# -- code (one per proposal, in parallel) ---------------------------------------------------------
def code(task: CodeTask, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    ctx = _ctx(runtime)
    pid = task["problem_id"]
    problem = ctx.problems[pid]
    prop = Proposal(**task["proposal"])
    # parallel tasks of one step: the proposal names the event
    key = event_key(config, "code", prop.parent_id or "-", _proposal_hash(task["proposal"]))
    parent = ctx.store.get_candidate(prop.parent_id) if prop.parent_id else None
    from kernellab.agents.builtin.inductor import ACTION as INDUCTOR_ACTION  # light: no torch.compile import

    inductor = (prop.action or {}).get("kind") == INDUCTOR_ACTION
    try:
        # parallel tasks: their seconds add up to more than the step's wall time
        with timed_step(ctx, "code", pid, label="Inductor seed" if inductor else None,
                        slow="Inductor seed compiled" if inductor else "candidate written",
                        start="compiling the Inductor seed (torch.compile)" if inductor else None,
                        idea=str(prop.idea or "")[:120]):
            out = ctx.agents.code(problem, prop, parent)
    except ctx.passthrough:
        raise
    except Exception as exc:  # a coder failure is recorded, never fatal to the campaign
        ctx.event("code", {"problem_id": pid, "proposal": task["proposal"], "error": f"{type(exc).__name__}: {exc}"},
                  key)
        return {}
    cid = ctx.store.add_candidate(
        ctx.campaign_id, pid, out.source, parent_id=prop.parent_id, parents=prop.parents,
        origin=out.origin, model=out.model, action=out.action or prop.idea, language=out.language,
        space=_space_of(out), meta=out.meta)
    ctx.event("code", {"problem_id": pid, "candidate_id": cid, "action": out.action, "idea": prop.idea}, key)
    if ctx.start_evaluation is not None:  # under way while the step's other tasks (the Inductor seed) still code
        try:
            ctx.start_evaluation(problem, ctx.store.get_candidate(cid))
        except ctx.passthrough:
            raise
        except Exception:  # noqa: S110 -- the evaluate step submits it then, and meets the error itself
            pass
    return {}


def _proposal_hash(proposal: dict) -> str:
    return content_hash(canonical_json(proposal))[:12]


# -- evaluate -------------------------------------------------------------------------------------
def _record(ctx: Context, problem: Problem, cand: dict, result: dict, key: str | None) -> None:
    """One evaluation's outcome: the judged ``full`` row (with its modelled time when interpreted), or,
    for an infrastructure failure, an ``infra`` event and another try at the next evaluate step."""
    cid = cand["id"]
    if is_infra(result):
        # not the candidate's verdict: no `full` row (so no debugger either), tried again later
        ctx.infra_failures[cid] = ctx.infra_failures.get(cid, 0) + 1
        details = result.get("details") or {}
        ctx.event("infra", {"candidate_id": cid, "error_class": result.get("error_class"),
                            "error_text": (result.get("error_text") or "")[:2000],
                            "attempt": ctx.infra_failures[cid]}, key and f"{key}/{cid}")
        if details.get("breaker") or result.get("error_class") == "shutdown":
            raise SandboxUnavailable(f"the sandbox cannot evaluate candidates: {result.get('error_text')}")
        return
    if ctx.model is not None and result.get("interpreted") and result.get("status") == "correct":
        modelled = ctx.model(problem, cand, result)
        if modelled:
            result = {**result, "details": {**(result.get("details") or {}), "modelled": modelled}}
    ctx.store.add_evaluation(cid, result, kind=Kind.FULL)
    if ctx.progress:
        ctx.progress.on_evaluation(result)
        ctx.progress.update(in_flight=max(0, ctx.progress.stats.in_flight - 1), last=f"{cid[:10]} {result['status']}")


def evaluate(state: CampaignState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    """Evaluate every candidate of the problem that has no judged (``full``) evaluation yet."""
    ctx = _ctx(runtime)
    problem = ctx.problems[_pid(state)]
    cands = ctx.store.candidates(ctx.campaign_id, _pid(state))
    todo = [c for c in cands if ctx.infra_failures.get(c["id"], 0) < MAX_INFRA
            and not any(e["kind"] == Kind.FULL for e in ctx.store.evaluations(candidate_id=c["id"]))]
    if not todo:
        return {}
    if ctx.progress:  # the tree as coded so far: the panel's budget left counts these
        ctx.progress.update(in_flight=len(todo), tree_size=len(cands))
    by_id = {c["id"]: c for c in todo}
    key = event_key(config, "evaluate")
    with timed_step(ctx, "evaluate", _pid(state), slow=f"{len(todo)} evaluation(s)", candidates=len(todo)) as info:
        # where the evaluations' wall time went (the torch.compile baseline is a phase of the first job)
        phases: dict[str, float] = info.setdefault("phases", {})
        for cand_id, result in ctx.evaluate_many(problem, todo):
            _record(ctx, problem, by_id[cand_id], result, key)
            for ph, sec in ((result.get("details") or {}).get("phase_s") or {}).items():
                phases[ph] = round(phases.get(ph, 0.0) + float(sec), 3)
    return {}


def _debuggable(ctx: Context, pid: str) -> list[tuple[dict, dict]]:
    tried = {e["payload"].get("candidate_id") for e in ctx.store.events(ctx.campaign_id, "debug")}
    out = []
    for c in ctx.store.candidates(ctx.campaign_id, pid):
        if c["id"] in tried or (c.get("meta") or {}).get("debug_round", 0) >= _max_debug(ctx):
            continue
        full = [e for e in ctx.store.evaluations(candidate_id=c["id"]) if e["kind"] == Kind.FULL]
        # a problem's fault (error class `problem`) is not the candidate's: nothing for the debugger to fix
        if full and full[0]["status"] in FAILED and full[0].get("error_class") != "problem":
            out.append((c, full[0]))
    return out


def after_evaluate(state: CampaignState, runtime: Runtime[Context]) -> str:
    ctx, pid = _ctx(runtime), _pid(state)
    return "debug" if _max_debug(ctx) > 0 and _remaining(ctx, pid) > 0 and _debuggable(ctx, pid) else "tune"


# -- debug ----------------------------------------------------------------------------------------
def debug(state: CampaignState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    ctx = _ctx(runtime)
    pid = _pid(state)
    problem = ctx.problems[pid]
    key = event_key(config, "debug")
    for cand, ev in _debuggable(ctx, pid):
        if _remaining(ctx, pid) <= 0:
            break
        ekey = key and f"{key}/{cand['id']}"
        try:
            with timed_step(ctx, "debug", pid, candidate_id=cand["id"]):
                fix = ctx.agents.debug(problem, cand, ev)
        except ctx.passthrough:
            raise
        except Exception as exc:
            ctx.event("debug", {"candidate_id": cand["id"], "error": f"{type(exc).__name__}: {exc}"}, ekey)
            continue
        payload = {"candidate_id": cand["id"], "status": ev["status"], "diagnosis": fix.diagnosis}
        if fix.source:
            meta = {**(fix.meta or {}), "debug_round": (cand.get("meta") or {}).get("debug_round", 0) + 1,
                    "debug_of": cand["id"]}
            payload["fixed_candidate_id"] = ctx.store.add_candidate(
                ctx.campaign_id, pid, fix.source, parent_id=cand["id"], origin=cand["origin"],
                model=cand["model"], action=fix.action or f"debug: {fix.diagnosis[:80]}",
                language=cand["language"], space=_space_from_source(fix.source), meta=meta)
        ctx.event("debug", payload, ekey)
    return {}


# -- tune, profile, analyze -----------------------------------------------------------------------
# a candidate this many times slower than the problem's fastest is not tuned: of 165 tunings on KernelBench
# (the committed database, 2026-12-04), the 28 of candidates > 3x slower than their problem's fastest made
# no winner; one 2.1x slower did (2.69x gained)
TUNE_GAP = 3.0


def tune(state: CampaignState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    """Tune every correct candidate with a SPACE not tuned yet, all at once: their studies' trials share
    the sandbox pool (one after another, a solo campaign's three tunings took 24 s of its 103 s, each
    waiting for the slowest trial of the one before). Not a library-only one: none of its kernels ran
    (KernelBench's 54_conv_standard_3D on the H200: 174 s tuning the tiles of a conv cuDNN ran). Nor one
    ``TUNE_GAP`` times slower on the GPU than the problem's fastest candidate, nor one already at the
    problem's floor (``ctx.at_floor``, the roofline stop's own rule): a ``tune`` event says why."""
    ctx = _ctx(runtime)
    if ctx.tune is None:
        return {}
    pid = _pid(state)
    problem = ctx.problems[pid]
    deadline = _deadline(ctx, state)
    done = {e["payload"].get("candidate_id") for e in ctx.store.events(ctx.campaign_id, "tune")}
    todo, timed, floor = [], {}, {}
    for c in ctx.store.candidates(ctx.campaign_id, pid):
        full = [e for e in ctx.store.evaluations(candidate_id=c["id"]) if e["kind"] == Kind.FULL]
        if full and full[0]["status"] == "correct" and full[0].get("median_ms") and not full[0].get("interpreted", True):
            timed[c["id"]] = float(full[0]["median_ms"])
        if c["id"] in done or not c.get("space"):
            continue
        if full and full[0]["status"] == "correct" and not full[0].get("library_only"):
            todo.append(c)
            if c["id"] in timed:
                floor[c["id"]] = ctx.at_floor(pid, c["id"], full[0])
    if not todo or (deadline is not None and time.monotonic() >= deadline):
        return {}  # no event: a resumed campaign with time left tunes them then
    # no tile beats the floor: 29_Softplus's seed ran at 101% of it, then tuned 364 s to reach the same 3.0 ms
    for c in [c for c in todo if floor.get(c["id"])]:
        todo.remove(c)
        ctx.event("tune", {"candidate_id": c["id"], "skipped": f"{floor[c['id']].removeprefix('roofline: ')}: "
                           "no tuning beats the floor"}, event_key(config, "tune", c["id"]))
    if not todo:
        return {}
    if timed:
        # tiles and warps rarely close a gap this wide (100_HingeLoss spent 249 s tuning a seed 464x slower)
        fastest = min(timed, key=timed.get)
        for c in [c for c in todo if timed.get(c["id"], 0.0) > TUNE_GAP * timed[fastest]]:
            todo.remove(c)
            ctx.event("tune", {"candidate_id": c["id"], "skipped": f"{timed[c['id']] / timed[fastest]:.0f}x slower "
                               f"than {fastest[:10]}, beyond what tuning gains ({TUNE_GAP:g}x)"},
                      event_key(config, "tune", c["id"]))
        if not todo:
            return {}

    def one(c: dict) -> None:
        try:
            with timed_step(ctx, "tune", pid, slow=f"tuning of {c['id'][:10]}", start=f"tuning {c['id'][:10]}",
                            candidate_id=c["id"]) as info:
                summary = ctx.tune(problem, c, deadline=deadline) or {}
                info["trials"] = summary.get("evaluated")
        except ctx.passthrough:
            raise
        except Exception as exc:  # a space the tuner cannot read costs the tuning, not the campaign
            summary = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        ctx.event("tune", {"candidate_id": c["id"], **summary}, event_key(config, "tune", c["id"]))

    if len(todo) == 1:
        one(todo[0])
        return {}
    pool = ThreadPoolExecutor(max_workers=len(todo), thread_name_prefix="kernellab-tune")
    try:
        for fut in [pool.submit(one, c) for c in todo]:
            fut.result()  # the first failure that is not the tuning's own (a stop, the sandbox gone) propagates
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return {}


def _best_of(ctx: Context, pid: str) -> dict | None:
    rows = ctx.store.reported_best(ctx.campaign_id, pid, ctx.config.objective)
    return rows[0] if rows else None


def profile(state: CampaignState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    ctx = _ctx(runtime)
    pid = _pid(state)
    best = _best_of(ctx, pid)
    deadline = _deadline(ctx, state)
    if ctx.profile is None or best is None or (deadline is not None and time.monotonic() >= deadline):
        return {}
    cand = ctx.store.get_candidate(best["candidate_id"])
    if ctx.store.evaluations(candidate_id=cand["id"], kind="profile") or any(
            e["payload"].get("candidate_id") == cand["id"] for e in ctx.store.events(ctx.campaign_id, "profile")):
        return {}
    if (best.get("speedup_compile") or 0) >= 1.0:
        # a profile feeds the next round's plan and, where torch.compile wins, the page's "where we lose":
        # with no next round and torch.compile beaten, nothing reads it (10 s of a 86 s solo campaign; 42 s
        # of 21_Sigmoid's at KernelBench's size)
        ending = "the budget is spent" if _remaining(ctx, pid) <= 0 else ctx.stop_check(pid, state)
        if ending:
            ctx.event("profile", {"candidate_id": cand["id"], "metrics": 0,
                                  "skipped": f"{ending}, and the best beats torch.compile: no plan or page reads "
                                             "this profile"}, event_key(config, "profile"))
            return {}
    with timed_step(ctx, "profile", pid, slow="Nsight Compute profile", candidate_id=cand["id"]):
        metrics, why_not = ctx.profile(ctx.problems[pid], cand, best)
    if metrics:
        ctx.store.add_evaluation(cand["id"], {"status": "correct", "config": best.get("config"),
                                              "device": best.get("device")}, kind="profile", metrics=metrics)
    payload = {"candidate_id": cand["id"], "metrics": len(metrics), "skipped": why_not}
    if getattr(metrics, "seconds", None):  # where the profile's wall time went, and how long it held the GPU alone
        payload["seconds"] = dict(metrics.seconds)
    ctx.event("profile", payload, event_key(config, "profile"))
    return {}


def analyze(state: CampaignState, runtime: Runtime[Context], config: RunnableConfig) -> dict:
    ctx = _ctx(runtime)
    pid = _pid(state)
    best = _best_of(ctx, pid)
    key = event_key(config, "analyze")
    if best is not None and not any(e["payload"].get("candidate_id") == best["candidate_id"]
                                    for e in ctx.store.events(ctx.campaign_id, "analyze")):
        cand = ctx.store.get_candidate(best["candidate_id"])
        prof = ctx.store.evaluations(candidate_id=cand["id"], kind="profile")
        metrics = ctx.store.metrics(prof[-1]["id"]) if prof else []
        try:
            with timed_step(ctx, "analyze", pid, candidate_id=cand["id"]):
                a = ctx.agents.analyze(ctx.problems[pid], cand, best, metrics)
            ctx.event("analyze", {"candidate_id": cand["id"], **a.to_dict()}, key)
        except ctx.passthrough:
            raise
        except Exception as exc:
            ctx.event("analyze", {"candidate_id": cand["id"], "error": f"{type(exc).__name__}: {exc}"}, key)
    grew = len(ctx.store.candidates(ctx.campaign_id, pid)) > state.get("n_before", 0)
    return {"round": state.get("round", 0) + 1, "empty_rounds": 0 if grew else state.get("empty_rounds", 0) + 1}


def retry_policy(transient: tuple[type[BaseException], ...] = TRANSIENT) -> RetryPolicy:
    """One more attempt (after a short pause) for an error in ``transient``; never for anything else."""
    return RetryPolicy(max_attempts=3, initial_interval=0.2, jitter=False,
                       retry_on=lambda exc: isinstance(exc, transient))


def build_graph(transient: tuple[type[BaseException], ...] = TRANSIENT) -> StateGraph:
    """The wiring only; the nodes read their ``Context`` from ``invoke(..., context=ctx)``."""
    g = StateGraph(CampaignState, context_schema=Context)
    retry = retry_policy(transient)
    for name, fn in (("select", select), ("plan", plan), ("code", code), ("evaluate", evaluate),
                     ("debug", debug), ("tune", tune), ("profile", profile), ("analyze", analyze)):
        g.add_node(name, fn, retry_policy=retry)
    g.add_edge(START, "select")
    g.add_conditional_edges("select", after_select, ["plan", END])
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
    return space_from_source(source)
