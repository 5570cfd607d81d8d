"""Starting, checking, running and resuming a campaign through the agent graph; the campaigns this process runs
now, and marking them stopped."""

from __future__ import annotations

import datetime as _dt
import os
import sqlite3
import threading
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from kernellab import _interrupt, _runtime, env
from kernellab.campaign.config import CampaignConfig, CampaignError, _problems_of
from kernellab.campaign.lock import campaign_lock
from kernellab.campaign.retime import _retime
from kernellab.campaign.steps import _Steps
from kernellab.campaign.timeline import step_times, step_times_line
from kernellab.problem import Problem, ProblemError, load_problem
from kernellab.small import instance_sizes, small_fault, small_overrides
from kernellab.vocab import small_for

if TYPE_CHECKING:
    from kernellab.agents.graph import Context
    from kernellab.store import BaseStore


def start_campaign(store: Any, config: CampaignConfig, name: str | None = None, agents: Any = None,
                   problems: list[Problem] | None = None) -> str:
    """Validate the configuration and the problems, then create the campaign (nothing is written
    when a problem file is bad). ``agents`` (LLM agents with their own transport, as given to
    ``run_campaign``) are the ones preflighted instead of a backend built from ``config``.
    ``problems``: what :func:`check_campaign` returned, when the caller checked already."""
    if problems is None:
        problems = check_campaign(config, store=store, agents=agents)
    device = config.device or env.default_device()
    name = name or f"{'+'.join(p.name for p in problems)[:60]}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    cfg = asdict(config)
    cfg["problem_ids"] = [store.add_problem(p) for p in problems]
    if config.llm != "builtin":  # which prompts and skills: `kernellab compare --by prompts` groups by it
        from kernellab.agents.llm import prompts_version

        cfg["prompts"] = prompts_version(config.llm)
    return store.create_campaign(name, cfg, env.device_name(device), env.versions(device))


def check_campaign(config: CampaignConfig, store: Any = None, agents: Any = None,
                   problems: list[Problem] | None = None) -> list[Problem]:
    """Everything that can be wrong before any work: options, problem files, the policy, and the LLM
    backend's key, server and model (``store`` only for ``--replay``, which reads recorded calls).
    ``problems``: already loaded problems (the Python API's), instead of loading ``config.problems``."""
    config.validate()
    if problems is None:
        problems = [load_problem(p) for p in config.problems]
    if small_for(config.device or env.default_device(), config.small):
        # refused in seconds: the sandbox would refuse every candidate of a problem with no usable SMALL instance
        for p in problems:
            small_overrides(p)
            why = small_fault(p, config.trials)  # the sandbox would refuse every candidate: say so now
            if why:
                raise ProblemError(f"{p.label}: {why} ({instance_sizes(p, True)['text']})")
    _check_policy(config.policy)
    if config.llm != "builtin":
        from kernellab.agents.llm import PreflightError

        try:
            if agents is not None:
                agents.preflight()
            else:
                # the store: a --replay campaign is looked up in it
                _llm_agents(config, store=store, campaign_id=None, preflight=True)
        except PreflightError as exc:
            raise CampaignError(str(exc)) from None
    return problems


PROBLEM_FAULT = "the problem itself is at fault"


def problem_fault(store: Any, tree: Any) -> str | None:
    """The stop reason of a problem the sandbox found at fault (error class ``problem``: its reference
    failed, or no trial is informative): no candidate can be correct, so no budget goes to more."""
    for node in tree:
        if node.error_class == "problem":
            rows = [e for e in store.evaluations(candidate_id=node.id) if e.get("error_class") == "problem"]
            text = (rows[-1].get("error_text") or "") if rows else ""
            return f"{PROBLEM_FAULT}: {text.splitlines()[0] if text else 'see the evaluations'}"
    return None


def _check_policy(name: str) -> None:
    from kernellab import search

    if name not in search.POLICIES:
        raise CampaignError(f"--policy {name!r} is not one of {', '.join(sorted(search.POLICIES))}")


def _llm_agents(config: CampaignConfig, store: Any, campaign_id: str | None, preflight: bool = False) -> Any:
    from kernellab.agents import llm

    agents = llm.make_agents(config.llm, base_url=config.base_url, store=store, campaign_id=campaign_id,
                             replay=config.replay, budget_usd=config.usd_budget)
    if preflight:  # with replay: checks there are recorded answers, no network
        agents.preflight()
    return agents


def make_agents(config: CampaignConfig, store: Any, campaign_id: str) -> Any:
    if config.llm == "builtin":
        from kernellab.agents.builtin import BuiltinAgents

        device = config.device or env.default_device()
        on = config.inductor_seed if config.inductor_seed is not None else device == "cuda"
        return BuiltinAgents(inductor={"device": device, "small": config.small} if on else None)
    return _llm_agents(config, store, campaign_id)


def run_campaign(store: Any, campaign_id: str, progress: Any = None, executor: Any = None,
                 agents: Any = None) -> dict:
    """Run (or continue) a campaign to the end of its budgets, then re-time each problem's winner;
    returns the store's summary. ``agents`` replaces the backend the campaign's ``llm`` names (any
    object implementing ``kernellab.agents.roles.Agents``, e.g. ``make_agents(..., http_client=...)``
    for a custom transport). Raises :class:`CampaignBusy` when another process runs it now."""
    _runtime.setup()  # the interpreter switch and the ast lock, before any work (kernellab._runtime)
    camp = store.get_campaign(campaign_id)
    if camp is None:
        raise CampaignError(f"no campaign {campaign_id!r}")
    # its winner is picked by comparing the medians of all its evaluations: they must come from one device
    here = env.device_name((camp.get("config") or {}).get("device") or env.default_device())
    if not env.timings_compare(camp.get("device"), here):
        raise CampaignError(f"campaign {camp['name']} ran on {camp['device']} and this host's device is {here}: "
                            "their timings would not compare; resume it on that device")
    with campaign_lock(store, camp["id"], camp["name"]):
        return _run_locked(store, camp, progress, executor, agents)


def campaign_executor(device: str, executor: Any = None) -> Any:
    """``executor``, or this host's own (shut down on a signal), warmed for a campaign on ``device``: its workers
    start while the campaign plans and codes, and on a GPU an Nsight Compute target too (a campaign there
    profiles)."""
    from kernellab import sandbox

    executor = executor or _interrupt.watch(sandbox.LocalExecutor())
    executor.warm(device, profile=device == "cuda")
    return executor


def _run_locked(store: Any, camp: dict, progress: Any, executor: Any, agents: Any) -> dict:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from kernellab.agents.graph import build_graph, timed_step

    cfg_dict = {k: v for k, v in camp["config"].items() if k in CampaignConfig.__dataclass_fields__}
    config = CampaignConfig(**cfg_dict)
    problems = _problems_of(store, camp)
    _runtime.stamp("entered")
    agents = agents if agents is not None else make_agents(config, store, camp["id"])
    _runtime.stamp("agents")
    device = config.device or env.default_device()
    own_executor = executor is None
    # after a SIGINT/SIGTERM the killed workers' results raise Stopped, never recorded as verdicts
    executor = _interrupt.guard(campaign_executor(device, executor))
    _runtime.stamp("executor")
    fresh = [p for pid, p in problems.items() if not store.candidates(camp["id"], pid)]
    if device == "cuda" and isinstance(getattr(agents, "inductor", None), dict):
        # the Inductor seed shares the GPU as jobs do (Executor.profiling)
        agents.inductor = {**agents.inductor, "gate": executor.profiling}
    prefetch = getattr(agents, "prefetch", None)  # the builtin agents' Inductor seeds, for problems not begun
    if prefetch is not None:
        prefetch(fresh)
    _runtime.stamp("prefetch")
    if device == "cuda":  # reference and baseline ahead, where the executor can
        for p in fresh:
            executor.prepare(p, small=config.small, device=device, trials=config.trials, store=store)
    _runtime.stamp("prepare")
    ctx = _context(store, camp, config, problems, agents, executor, device, progress)
    _runtime.stamp("context")
    if progress is not None:
        progress.update(campaign=camp["name"], problems_total=len(problems), budget_candidates=config.budget,
                        budget_wall_s=config.time_budget_s, budget_usd=config.usd_budget)
        small = small_for(device, config.small)
        for p in problems.values():  # the sizes judged, before anything is: a wrong instance is seen at once
            progress.note(f"{p.name}: {instance_sizes(p, small)['text']}")
    _running_here(store, camp["id"], True)
    store.update_campaign(camp["id"], status="running")
    _runtime.stamp("session")
    # the process's age at each point of its start-up (the CLI's imports and checks, the agents, the executor...)
    store.add_event(camp["id"], "session", {"started": True, "pid": os.getpid(), "startup_age_s": _runtime.stamps()})
    conn = sqlite3.connect(store.path, check_same_thread=False, timeout=60)
    failed = False
    try:
        graph = build_graph(ctx.transient).compile(checkpointer=SqliteSaver(conn))
        _invoke(graph, ctx, camp["id"], list(problems), progress)
        # after the graph, so that a resume of a campaign killed while re-timing re-times what is missing
        with timed_step(ctx, "retime", slow="winners re-timed", start="re-timing the winners in fresh jobs"):
            retimed = _retime(store, camp, config, problems, executor, device)
        store.add_event(camp["id"], "retime", {"problems": retimed})
        store.update_campaign(camp["id"], status="done")
        if progress is not None:
            progress.update(last="time by step: " + step_times_line(step_times(store, camp["id"])))
    except BaseException as exc:
        failed = True
        store.update_campaign(camp["id"], status="stopped")
        store.add_event(camp["id"], "session", {"stopped": f"{type(exc).__name__}: {exc}"[:500]})
        raise
    finally:
        _running_here(store, camp["id"], False)
        conn.close()
        if own_executor:
            # on Ctrl-C or an error kill the workers at once: a finished evaluation is already in the store,
            # nothing reads the ones in flight, and `resume` runs them again (waiting took a minute per busy
            # worker thread)
            executor.shutdown(wait=not failed)
    return store.summary(camp["id"])


# (store, campaign id) of the campaigns this process is running now: what a stop marks `stopped` when their
# threads cannot (kernellab._interrupt's watchdog, a bench's main thread)
_RUNNING: dict[tuple[int, str], tuple[Any, str]] = {}
_RUNNING_LOCK = threading.Lock()


def _running_here(store: Any, campaign_id: str, on: bool) -> None:
    with _RUNNING_LOCK:
        if on:
            _RUNNING[(id(store), campaign_id)] = (store, campaign_id)
        else:
            _RUNNING.pop((id(store), campaign_id), None)


def mark_stopped(store: Any, campaign_ids: Any, reason: str) -> list[str]:
    """Mark those of ``campaign_ids`` still ``running`` as ``stopped`` (resumable), with a ``session`` event
    saying why; returns their names. For campaigns whose own thread did not get to it before the process ends."""
    out = []
    for cid in campaign_ids:
        camp = store.get_campaign(cid)
        if camp is not None and camp["status"] == "running":
            store.update_campaign(cid, status="stopped")
            store.add_event(cid, "session", {"stopped": reason[:500], "marked_by": "stop"})
            out.append(camp["name"])
    return out


def mark_stopped_here(reason: str) -> list[str]:
    """:func:`mark_stopped` over every campaign this process is running now."""
    with _RUNNING_LOCK:
        held = list(_RUNNING.values())
    out = []
    for store, cid in held:
        try:
            out += mark_stopped(store, [cid], reason)
        except Exception:  # a store that fails here must not keep the others running
            pass
    return out


def _invoke(graph: Any, ctx: Context, campaign_id: str, problem_ids: list[str], progress: Any) -> None:
    """Start the graph, or go on from its last checkpoint."""
    run_cfg = {"configurable": {"thread_id": campaign_id}, "recursion_limit": 100_000}
    snap = graph.get_state(run_cfg)
    if progress is not None and hasattr(progress, "seed"):  # a resumed campaign's counts start from its past
        values = snap.values or {}
        ids = values.get("problem_ids") or problem_ids
        index = values.get("index", 0)
        # the graph names a problem only when its select node runs, which a resume mid-step reaches late
        pid = ids[index] if index < len(ids) and ids[index] in ctx.problems else None
        progress.seed(ctx.store, campaign_id, elapsed_before=values.get("elapsed_s", 0.0),
                      # a fresh start names its problem when select runs (the "problem X (1/n)" line)
                      problem=ctx.problems[pid].name if pid and values else "", problem_id=pid,
                      resumed="done" if values.get("done") and not snap.next else bool(values))
    if snap.values.get("done") and not snap.next:
        return  # finished before: nothing to do
    if snap.values:
        # killed mid-step: an empty ``next`` only says the step's finished tasks were saved as
        # pending writes; invoking again applies them and goes on
        graph.invoke(None, run_cfg, context=ctx)
    else:
        graph.invoke({"problem_ids": problem_ids, "index": 0, "round": 0, "elapsed_s": 0.0}, run_cfg, context=ctx)


def _context(store: BaseStore, camp: dict, config: CampaignConfig, problems: dict[str, Problem], agents: Any,
             executor: Any, device: str, progress: Any) -> Context:
    """The graph's ``Context``: the store, the agents, and the campaign's evaluate, select, stop,
    tune, profile, reference and cost-model steps."""
    from kernellab import search
    from kernellab.agents.builtin import modelled
    from kernellab.agents.graph import Context

    policy = search.get_policy(config.policy, seed=config.seed)
    budget = search.Budget.of_campaign(config)
    fatal: tuple = ()
    if config.llm != "builtin":
        from kernellab.agents import llm
        from kernellab.vocab import LLM_STOPS

        fatal = tuple(getattr(llm, name) for name in LLM_STOPS)  # the LLM's stops end the run, resumable

    floors: dict[str, float | None] = {}
    full_size = not small_for(device, config.small)  # the floor is counted at the problem's own sizes

    def floor_of(pid: str) -> float | None:
        if pid not in floors:
            floors[pid] = modelled.floor_ms(problems[pid]) if full_size and str(device).startswith("cuda") else None
        return floors[pid]

    def stop_check(pid: str, state: dict) -> str | None:
        tree = search.Tree(store, camp["id"], pid, objective=config.objective)
        fault = problem_fault(store, tree)
        if fault:
            return fault
        return search.stop_reason(tree, budget, store=store, campaign_id=camp["id"], elapsed_s=state.get("elapsed_s", 0.0),
                                  rounds=state.get("round", 0), target=config.target,
                                  plateau=config.plateau, plateau_gain=config.plateau_gain, floor_ms=floor_of(pid))

    def at_floor(pid: str, candidate_id: str, evaluation: dict) -> str | None:
        decision = search.StopRules(floor_ms=floor_of(pid)).at_floor(candidate_id, evaluation.get("median_ms"),
                                                                    evaluation.get("device"))
        return decision.reason if decision else None

    steps = _Steps(store, camp["id"], config, executor, device)
    return Context(fatal=fatal, store=store, campaign_id=camp["id"], config=config, problems=problems,
                   agents=agents, evaluate_many=steps.evaluate_many, start_evaluation=steps.start_evaluation,
                   select=policy.select,
                   make_tree=lambda pid: search.Tree(store, camp["id"], pid, objective=config.objective),
                   stop_check=stop_check, at_floor=at_floor,
                   tune=steps.tune if steps.tune_trials > 0 else None, profile=steps.profile, reference=steps.reference,
                   model=modelled.model_candidate if device != "cuda" else None,
                   # an LLM planner picks its own expansions: a variant would cost a coder call each
                   variants=modelled.config_variants if config.llm == "builtin" else None, progress=progress)



def resume_campaign(store: Any, ref: str, progress: Any = None, executor: Any = None, agents: Any = None,
                    usd_budget: float | None = None) -> dict:
    """Continue a campaign. ``usd_budget`` replaces its LLM dollar budget (the whole campaign's,
    what was spent included): the way on after a stop for ``BudgetExceeded``."""
    camp = store.get_campaign(ref)
    if camp is None:
        raise CampaignError(f"no campaign {ref!r} in {store.path}")
    if usd_budget is not None:
        if usd_budget <= 0:
            raise CampaignError(f"--usd-budget must be > 0, got {usd_budget}")
        store.update_campaign(camp["id"], config={**camp["config"], "usd_budget": usd_budget})
    return run_campaign(store, camp["id"], progress=progress, executor=executor, agents=agents)
