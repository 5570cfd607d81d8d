"""Campaigns: start one over problem files, run it through the agent graph, resume it after a stop,
a crash or ``kill -9``. The LangGraph checkpoints live in the campaign's own database
(``SqliteSaver``, ``thread_id`` = campaign id), next to the store's tables.

One process at a time runs a campaign: :func:`campaign_lock` (an ``flock`` on a file next to the
database, which the kernel drops when its holder dies, ``kill -9`` included). At its end each
problem's winner is re-timed in a fresh job (:func:`retime_winners`); that re-timing is the number
``status``, ``report``, ``export`` and ``bench`` print (``store.reported_best``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernellab import _interrupt, _runtime, env
from kernellab.problem import Problem, ProblemError, load_problem
from kernellab.small import instance_sizes, small_fault, small_overrides
from kernellab.vocab import DEFAULT_OBJECTIVE, OBJECTIVES, Kind, canonical_json

if TYPE_CHECKING:
    from kernellab.agents.graph import Context
    from kernellab.store import BaseStore

__all__ = ["CampaignConfig", "TUNE_TRIALS_MIN", "TUNE_TRIALS_MAX", "check_campaign", "start_campaign", "run_campaign",
           "resume_campaign", "CampaignError", "CampaignBusy", "campaign_lock", "is_held", "is_stale", "retime_winners", "run", "step_times",
           "step_times_line", "format_step_times", "mark_stopped", "mark_stopped_here"]


class CampaignError(RuntimeError):
    """A campaign that cannot start or continue (bad configuration, unknown campaign)."""


class CampaignBusy(CampaignError):
    """The campaign is being run by another process (or thread) right now."""


# Tuning on a GPU when --tune-trials is not given: Optuna trials per candidate = the candidate budget
# clamped to [TUNE_TRIALS_MIN, TUNE_TRIALS_MAX], so that a longer campaign also tunes each candidate
# longer (a trial is a quick timing, about the cost of one evaluation) and tuning costs at most about as
# many sandbox jobs per candidate as the whole search has candidates. Never more than the SPACE holds.
TUNE_TRIALS_MIN, TUNE_TRIALS_MAX = 4, 32


@dataclass
class CampaignConfig:
    problems: list[str]
    llm: str = "builtin"
    base_url: str | None = None
    budget: int = 8  # candidates per problem (debugger fixes included)
    time_budget_s: float | None = None  # active wall time for the whole campaign
    gpu_budget_s: float | None = None  # summed evaluation time
    usd_budget: float | None = None  # LLM dollars
    policy: str = "greedy"
    seed: int = 0
    trials: int = 5  # correctness trials per evaluation
    width: int = 4  # proposals expanded in parallel per round
    debug_rounds: int = 3
    tune_trials: int | None = None  # Optuna trials per candidate with a SPACE; 0 = none, None = tune_trials_on
    objective: str = DEFAULT_OBJECTIVE
    target: float | None = None  # stop a problem once this speedup is reached
    plateau: int = 8  # stop a problem when its last N new candidates gained < plateau_gain
    plateau_gain: float = 0.01
    device: str | None = None  # None = cuda when available, else cpu
    small: bool | None = None  # None = SMALL sizes on CPU only
    replay: str | None = None  # answer LLM calls from this campaign's recorded calls
    # builtin agents: also seed from torch.compile's own code; None = with CUDA only (on the CPU its
    # Triton kernels run in the interpreter, and compiling costs each problem tens of seconds)
    inductor_seed: bool | None = None
    # evaluate no source that any campaign in the store evaluated already on this device and software
    # with these settings: its result is recorded again, with details.reused_from (search.find_reusable)
    reuse: bool = True

    def validate(self) -> None:
        if not self.problems:
            raise CampaignError("no problem given")
        if self.budget < 1:
            raise CampaignError("--budget must be at least 1")
        if self.width < 1:
            raise CampaignError("--width must be at least 1")
        if self.trials < 1:
            raise CampaignError(f"--trials must be at least 1 (correctness trials per evaluation), got {self.trials}")
        if self.tune_trials is not None and self.tune_trials < 0:
            raise CampaignError(f"--tune-trials must be >= 0 (0: no tuning), got {self.tune_trials}")
        if self.objective not in OBJECTIVES:
            raise CampaignError(f"objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.device not in (None, "cpu", "cuda"):
            raise CampaignError(f"--device {self.device!r} is not cpu or cuda")
        if self.device == "cuda" and not env.has_cuda():
            raise CampaignError("--device cuda, but no CUDA device is visible")

    def tune_trials_on(self, device: str) -> int:
        """Optuna trials per candidate with a SPACE on ``device`` ("cuda" or "cpu"): ``tune_trials`` when
        given; else, on a GPU, the candidate budget clamped to [TUNE_TRIALS_MIN, TUNE_TRIALS_MAX], and
        on the CPU none (interpreted timings cannot rank configurations, and each costs minutes)."""
        if self.tune_trials is not None:
            return self.tune_trials
        if not str(device).startswith("cuda"):
            return 0
        return max(TUNE_TRIALS_MIN, min(TUNE_TRIALS_MAX, self.budget))


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
    if (config.device or env.default_device()) == "cpu" and config.small is not False:
        # refused in seconds, never run for minutes at full size in the interpreter
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


def _problems_of(store: Any, camp: dict) -> dict[str, Problem]:
    out = {}
    for pid in camp["config"]["problem_ids"]:
        row = store.get_problem(pid)
        out[pid] = Problem(name=row["name"], source=row["source"], path=row["path"])
    return out


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
    with campaign_lock(store, camp["id"], camp["name"]):
        return _run_locked(store, camp, progress, executor, agents)


def _run_locked(store: Any, camp: dict, progress: Any, executor: Any, agents: Any) -> dict:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from kernellab import sandbox
    from kernellab.agents.graph import build_graph, timed_step

    cfg_dict = {k: v for k, v in camp["config"].items() if k in CampaignConfig.__dataclass_fields__}
    config = CampaignConfig(**cfg_dict)
    problems = _problems_of(store, camp)
    agents = agents if agents is not None else make_agents(config, store, camp["id"])
    device = config.device or env.default_device()
    own_executor = executor is None
    executor = executor or _interrupt.watch(sandbox.LocalExecutor())
    # after a SIGINT/SIGTERM the killed workers' results raise Stopped, never recorded as verdicts
    executor = _interrupt.guard(executor)
    warm = getattr(executor, "warm", None)  # Executor.warm; a duck-typed executor may lack it
    if warm is not None:
        warm(device)  # the workers start while the campaign plans and codes
    fresh = [p for pid, p in problems.items() if not store.candidates(camp["id"], pid)]
    prefetch = getattr(agents, "prefetch", None)  # the builtin agents' Inductor seeds, for problems not begun
    if prefetch is not None:
        prefetch(fresh)
    prepare = getattr(executor, "prepare", None)  # LocalExecutor.prepare: reference and baseline ahead
    if prepare is not None and device == "cuda":
        for p in fresh:
            prepare(p, small=config.small, device=device, trials=config.trials, store=store)
    ctx = _context(store, camp, config, problems, agents, executor, device, progress)
    if progress is not None:
        progress.update(campaign=camp["name"], problems_total=len(problems), budget_candidates=config.budget,
                        budget_wall_s=config.time_budget_s, budget_usd=config.usd_budget)
        small = config.small if config.small is not None else device != "cuda"
        for p in problems.values():  # the sizes judged, before anything is: a wrong instance is seen at once
            progress.note(f"{p.name}: {instance_sizes(p, small)['text']}")
    _running_here(store, camp["id"], True)
    store.update_campaign(camp["id"], status="running")
    store.add_event(camp["id"], "session", {"started": True, "pid": os.getpid()})
    conn = sqlite3.connect(store.path, check_same_thread=False, timeout=60)
    failed = False
    try:
        graph = build_graph(ctx.transient).compile(checkpointer=SqliteSaver(conn))
        _invoke(graph, ctx, camp["id"], list(problems), progress)
        # after the graph, so that a resume of a campaign killed while re-timing re-times what is missing
        if progress is not None:
            progress.update(last="re-timing the winners in fresh jobs")
        with timed_step(ctx, "retime", slow="winners re-timed"):
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
    budget = search.Budget.of_campaign(asdict(config))
    fatal: tuple = ()
    if config.llm != "builtin":
        from kernellab.agents.llm import BudgetExceeded, LLMUnavailable, ReplayMiss

        fatal = (BudgetExceeded, LLMUnavailable, ReplayMiss)

    def stop_check(pid: str, state: dict) -> str | None:
        tree = search.Tree(store, camp["id"], pid, objective=config.objective)
        fault = problem_fault(store, tree)
        if fault:
            return fault
        return search.stop_reason(tree, budget, store=store, campaign_id=camp["id"], elapsed_s=state.get("elapsed_s", 0.0),
                                  rounds=state.get("round", 0), target=config.target,
                                  plateau=config.plateau, plateau_gain=config.plateau_gain)

    steps = _Steps(store, camp["id"], config, executor, device)
    return Context(fatal=fatal, store=store, campaign_id=camp["id"], config=asdict(config), problems=problems,
                   agents=agents, evaluate_many=steps.evaluate_many, select=policy.select,
                   make_tree=lambda pid: search.Tree(store, camp["id"], pid, objective=config.objective),
                   stop_check=stop_check, tune=steps.tune if steps.tune_trials > 0 else None, profile=steps.profile, reference=steps.reference,
                   model=modelled.model_candidate if device != "cuda" else None,
                   # an LLM planner picks its own expansions: a variant would cost a coder call each
                   variants=modelled.config_variants if config.llm == "builtin" else None, progress=progress)


class _Steps:
    """The campaign's evaluate, tune, profile and reference steps (the graph calls them through its Context)."""

    def __init__(self, store: BaseStore, campaign_id: str, config: CampaignConfig, executor: Any, device: str):
        self.store, self.campaign_id, self.config, self.executor, self.device = store, campaign_id, config, executor, device
        self._references: dict[str, dict] = {}
        self.tune_trials = config.tune_trials_on(device)

    def _settings(self, problem: Problem) -> dict:
        from kernellab import search

        small = self.config.small if self.config.small is not None else self.device != "cuda"
        return search.reuse_settings(trials=self.config.trials, small=small, mode=problem.mode)

    def _reusable(self, problem: Problem, cand: dict) -> dict | None:
        """A finished evaluation of the same source by any campaign, made under this campaign's
        conditions (``search.find_reusable``), as this candidate's result; None: evaluate it.
        Only with the local executor, whose workers run this host's device and software."""
        from kernellab import sandbox, search

        if not self.config.reuse or not isinstance(_interrupt.unwrap(self.executor), sandbox.LocalExecutor):
            return None
        known = search.find_reusable(self.store, problem.id, cand["source"], device=env.device_name(self.device),
                                     versions=env.versions(self.device), job=self._settings(problem),
                                     gpu=self.device == "cuda", exclude=cand["id"])
        return search.reused_result(known) if known is not None else None

    def evaluate_many(self, problem: Problem, cands: list[dict]) -> Iterator[tuple[str, dict]]:
        from kernellab import sandbox

        config = self.config
        todo = []
        for c in cands:
            reused = self._reusable(problem, c)
            if reused is None:
                todo.append(c)
            else:
                yield c["id"], reused
        if not todo:
            return
        job_settings = self._settings(problem)
        # evaluate() blocks on its job; threads keep several jobs in flight in the executor's pool
        pool = ThreadPoolExecutor(max_workers=max(1, min(len(todo), config.width)))
        try:
            futs = {pool.submit(sandbox.evaluate, problem, c["source"], small=config.small, device=self.device,
                                trials=config.trials, store=self.store, executor=self.executor): c["id"]
                    for c in todo}
            for fut in as_completed(futs):
                result = fut.result()
                # what a later campaign's reuse compares with (search.find_reusable)
                result["details"] = {**(result.get("details") or {}), "settings": job_settings}
                yield futs[fut], result
        except BaseException:
            # Ctrl-C: leave the threads waiting on jobs; the executor's shutdown kills their workers
            # (waiting here held the interrupt for as long as the slowest evaluation took)
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)

    def tune(self, problem: Problem, cand: dict, deadline: float | None = None) -> dict | None:
        from kernellab import search

        config = self.config
        if self.tune_trials <= 0:
            return None
        # search.tune returns TuneResult.to_dict() already
        return search.tune(problem, cand, store=self.store, executor=self.executor, n_trials=self.tune_trials,
                           seed=config.seed, small=config.small, device=self.device, deadline=deadline,
                           objective=config.objective)

    def profile(self, problem: Problem, cand: dict, best: dict) -> tuple[list, str | None]:
        from kernellab import sandbox

        if self.device != "cuda":
            return [], "no CUDA device: Nsight Compute profiling skipped"
        small = bool(self.config.small)
        remote = getattr(self.executor, "profile", None)
        if remote is not None:  # a cluster: ncu runs on a worker's GPU, held there as a timing holds it
            rows = remote(problem, cand["source"], config=best.get("config") or None, small=small)
            return list(rows), getattr(rows, "reason", None)
        # the GPU to itself for the profiled forward, as a timing has it: no other job's trials run under
        # the profiler's replays (the profiled process's start-up and warm-up share the GPU)
        gated = getattr(self.executor, "profiling", None)
        if gated is not None:
            with gated(problem, small=small) as gate:
                rows = sandbox.profile(problem, cand["source"], config=best.get("config") or None, small=small,
                                       gpu=gate.gpu, gate=gate if gate.gpu is not None else None)
            return rows, getattr(rows, "reason", None)  # a ProfileResult: its `seconds` go in the profile event
        exclusive = getattr(self.executor, "exclusive_gpu", None)
        with exclusive(problem, small=small) if exclusive else contextlib.nullcontext() as gpu:
            rows = sandbox.profile(problem, cand["source"], config=best.get("config") or None, small=small, gpu=gpu)
        return list(rows), getattr(rows, "reason", None)

    def reference(self, problem: Problem) -> dict:
        """The reference's op profile for the planner: the one recorded for this problem (a ``reference``
        event, so a resume plans alike), else the builtin cost model's of its captured graph (H200
        shares, also on a CPU whose own op times would say nothing about the GPU)."""
        if problem.id not in self._references:
            known = [e["payload"] for e in self.store.events(self.campaign_id, "reference")
                     if e["payload"].get("problem_id") == problem.id]
            if known:
                prof = known[-1].get("profile") or {}
            else:
                from kernellab.agents.builtin import modelled

                prof = modelled.reference_profile(problem)
                self.store.add_event(self.campaign_id, "reference", {"problem_id": problem.id, "profile": prof})
            self._references[problem.id] = prof
        return self._references[problem.id]


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


# -- one run of a campaign at a time ---------------------------------------------------------------
_HELD: set[tuple[str, str]] = set()  # (database, campaign) locked by this process: ":memory:" stores
_HELD_LOCK = threading.Lock()


@contextmanager
def campaign_lock(store: Any, campaign_id: str, name: str | None = None) -> Iterator[None]:
    """Hold the campaign for this run, or raise :class:`CampaignBusy` at once.

    An ``flock`` on ``<database>.<campaign id>.lock``: the kernel releases it when the holder exits or
    is killed (``kill -9`` too), so a crashed run never blocks its resume, and no liveness check is
    needed. The file keeps the holder's pid and host for the message, and is removed when the run
    ends (a killed run leaves it, unlocked, for the next to take). An in-memory store is only
    reachable from this process: a set of held ids does there."""
    label = name or campaign_id
    if getattr(store, "memory", False) or str(getattr(store, "path", ":memory:")) == ":memory:":
        key = (str(id(store)), campaign_id)
        with _HELD_LOCK:
            if key in _HELD:
                raise CampaignBusy(f"campaign {label!r} is already running in this process")
            _HELD.add(key)
        try:
            yield
        finally:
            with _HELD_LOCK:
                _HELD.discard(key)
        return
    import fcntl

    path = _lock_path(store, campaign_id)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            finally:
                os.close(fd)
            raise CampaignBusy(f"campaign {label!r} is already running ({holder}): wait for it to end, "
                               "or stop that process, then resume") from None
        # the holder before us unlinks the file as it lets go: a lock on an unlinked file guards nothing
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)  # still holding it, so no one can have locked this file meanwhile
        except FileNotFoundError:
            pass
        os.close(fd)  # releases the flock


def _lock_path(store: Any, campaign_id: str) -> Path:
    return Path(f"{Path(store.path).resolve()}.{campaign_id}.lock")


def is_held(store: Any, campaign_id: str) -> bool:
    """Whether some process holds :func:`campaign_lock` for the campaign now (runs or re-times it)."""
    if getattr(store, "memory", False) or str(getattr(store, "path", ":memory:")) == ":memory:":
        with _HELD_LOCK:
            return any(cid == campaign_id for _, cid in _HELD)
    import fcntl

    try:
        # no O_CREAT: a missing file is a free lock, and a reader must not leave files behind
        fd = os.open(_lock_path(store, campaign_id), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        # a shared probe, let go at once: a run starting in that instant is refused as busy, never two run
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # releases the probe
    return False


def is_stale(store: Any, camp: dict) -> bool:
    """A campaign marked ``running`` whose process is gone (``kill -9``, a crash, a lost machine): its
    lock is free. Such a campaign goes on with ``kernellab resume``."""
    return camp.get("status") == "running" and not is_held(store, camp["id"])


# -- where a campaign's time went -------------------------------------------------------------------
def step_times(store: Any, campaign: str) -> dict:
    """A campaign's time summed by step, from its ``step`` events (``agents.graph.timed_step``; every
    session's, a resumed campaign's included): ``steps`` (step, seconds, count, max_s; a step nested in
    another, such as the planner's reference profile, is not in its parent's sum twice but under
    ``parts``), ``parts`` (labelled steps: the Inductor seed's compile, the reference profile) and
    ``evaluation_phases`` (the evaluations' wall seconds by sandbox phase: load, reference, baseline,
    compile, timing, waits for the GPU's lock...). Seconds of parallel tasks (``code``) add up."""
    camp = store.get_campaign(campaign)
    if camp is None:
        raise CampaignError(f"no campaign {campaign!r}")

    def add(table: dict, key: tuple, step: str, label: str | None, sec: float) -> None:
        row = table.setdefault(key, {"step": step, "label": label, "seconds": 0.0, "count": 0, "max_s": 0.0})
        row["seconds"] += sec
        row["count"] += 1
        row["max_s"] = max(row["max_s"], sec)

    steps: dict = {}
    parts: dict = {}
    phases: dict[str, float] = {}
    for e in store.events(camp["id"], "step"):
        p = e["payload"]
        sec = float(p.get("seconds") or 0.0)
        if not p.get("within"):
            add(steps, (p["step"],), p["step"], None, sec)
        if p.get("label"):
            add(parts, (p["step"], p["label"]), p.get("within") or p["step"], p["label"], sec)
        for ph, v in (p.get("phases") or {}).items():
            phases[ph] = phases.get(ph, 0.0) + float(v)
    rnd = lambda rows: [{**r, "seconds": round(r["seconds"], 3), "max_s": round(r["max_s"], 3)}  # noqa: E731
                        for r in sorted(rows, key=lambda r: -r["seconds"])]
    return {"campaign": camp["name"], "steps": rnd(steps.values()), "parts": rnd(parts.values()),
            "evaluation_phases": {k: round(v, 3) for k, v in sorted(phases.items(), key=lambda kv: -kv[1])}}


def step_times_line(summary: dict, n: int = 6) -> str:
    """The largest steps of :func:`step_times` on one line (the campaign's last progress line)."""
    return ", ".join(f"{r['step']} {r['seconds']:.0f} s" for r in summary["steps"][:n]) or "no steps recorded"


def format_step_times(summary: dict) -> str:
    """:func:`step_times` as text: one line per step, its labelled parts under it, then the phases."""
    lines = [f"campaign {summary['campaign']}: seconds by step (parallel code tasks add up)"]
    for r in summary["steps"]:
        lines.append(f"  {r['step']:<10} {r['seconds']:9.1f} s  {r['count']:4d} x, longest {r['max_s']:.1f} s")
        for p in summary["parts"]:
            if p["step"] == r["step"]:
                lines.append(f"    {p['label']:<28} {p['seconds']:9.1f} s  {p['count']:4d} x, longest {p['max_s']:.1f} s")
    if summary["evaluation_phases"]:
        lines.append("  evaluations by sandbox phase: "
                     + ", ".join(f"{k} {v:.1f} s" for k, v in summary["evaluation_phases"].items()))
    return "\n".join(lines)


# -- the winners, re-timed -------------------------------------------------------------------------
# error classes of a job the sandbox could not run at all: they say nothing about the candidate
_INFRA = ("shutdown", "worker_start", "sandbox")


def retime_winners(store: Any, campaign: str, *, executor: Any = None, problem: str | None = None,
                   force: bool = False, attempts: int = 3) -> list[dict]:
    """Re-time each problem's winner (``store.best`` under the campaign's objective) in a fresh job:
    the candidate, eager and (on CUDA) torch.compile timed interleaved in that one job
    (``EvalJob(retime=True)``), recorded as a ``retime`` evaluation marked ``details.winner_retime``
    with the p20/p80 of each and whether the candidate's p80 is below each baseline's p20.

    The best of many evaluations is biased up by noise; this one number is not, and it is what the
    store's ``reported_best`` returns. A winner whose re-timing is not correct (e.g. wrong on the
    new job's inputs) is out, and the next best is re-timed, up to ``attempts`` per problem. A winner
    re-timed already is skipped unless ``force``. Returns one line of outcome per problem."""
    camp = store.get_campaign(campaign)
    if camp is None:
        raise CampaignError(f"no campaign {campaign!r}")
    cfg_dict = {k: v for k, v in camp["config"].items() if k in CampaignConfig.__dataclass_fields__}
    config = CampaignConfig(**cfg_dict)
    problems = _problems_of(store, camp)
    if problem is not None:
        problems = {pid: p for pid, p in problems.items() if problem in (pid, p.name)}
        if not problems:
            raise CampaignError(f"campaign {camp['name']!r} has no problem {problem!r}")
    from kernellab import sandbox

    own = executor is None
    executor = _interrupt.guard(executor or _interrupt.watch(sandbox.LocalExecutor()))
    try:
        return _retime(store, camp, config, problems, executor, config.device or env.default_device(),
                       force=force, attempts=attempts)
    finally:
        if own:
            executor.shutdown()


def _retime(store: Any, camp: dict, config: CampaignConfig, problems: dict[str, Problem], executor: Any,
            device: str, force: bool = False, attempts: int = 3) -> list[dict]:
    from kernellab import sandbox
    from kernellab.store import WINNER_RETIME, is_winner_retime

    out: dict[str, dict] = {}
    tries = dict.fromkeys(problems, 0)
    while tries:
        jobs = {}
        for pid in list(tries):
            name = problems[pid].name
            rows = store.best(camp["id"], pid, config.objective)
            if not rows:
                out.setdefault(pid, {"problem": name, "outcome": "no correct candidate"})
                del tries[pid]
                continue
            sel = rows[0]
            earlier = [e for e in store.evaluations(candidate_id=sel["candidate_id"], kind=Kind.RETIME)
                       if is_winner_retime(e) and e["config_json"] == sel["config_json"]]
            if earlier and not (force and tries[pid] == 0):
                out[pid] = {"problem": name, "candidate_id": sel["candidate_id"], "evaluation_id": earlier[-1]["id"],
                            "outcome": "re-timed before"}
                del tries[pid]
                continue
            if tries[pid] >= attempts:
                out[pid] = {"problem": name, "outcome": f"gave up: {attempts} winners in a row failed their re-timing"}
                del tries[pid]
                continue
            cand = store.get_candidate(sel["candidate_id"])
            job = sandbox.EvalJob(problems[pid], cand["source"], config=sel.get("config") or None, small=config.small,
                                  device=device, trials=config.trials, store=store, retime=True)
            jobs[pid] = (sel, len(earlier), executor.submit(job))
        for pid, (sel, n, fut) in jobs.items():
            tries[pid] += 1
            try:
                result = dict(fut.result())
            except Exception as exc:  # the executor failed on it: nothing is known about the candidate
                result = {"status": "crash", "error_class": "sandbox", "error_text": f"{type(exc).__name__}: {exc}"}
            row = {"problem": problems[pid].name, "candidate_id": sel["candidate_id"], "status": result.get("status")}
            if result.get("status") != "correct" and result.get("error_class") in _INFRA:
                out[pid] = {**row, "outcome": f"not re-timed: {result.get('error_class')}: "
                                              f"{(result.get('error_text') or '')[:200]}"}
                del tries[pid]
                continue
            result["config"] = sel.get("config") or {}
            result["details"] = {**(result.get("details") or {}),
                                 WINNER_RETIME: {"selected": sel["id"], "objective": config.objective,
                                                 "band": _band(result)}}
            result["id"] = store.evaluation_id(sel["candidate_id"], result["config"], f"retime:winner:{n}")
            row["evaluation_id"] = store.add_evaluation(sel["candidate_id"], result, kind=Kind.RETIME)
            if result.get("status") == "correct":
                out[pid] = {**row, "outcome": "re-timed"}
                del tries[pid]
            else:  # out of the selection now: the next round re-times the next best
                out[pid] = {**row, "outcome": f"failed its re-timing ({result.get('error_class')})"}
    return [out[pid] for pid in problems if pid in out]


def _band(result: dict) -> dict:
    """The p20/p80 of the candidate and each baseline timed in the same job, and whether the
    candidate's p80 lies below the baseline's p20 (its band clears the baseline's). None where
    not measured; always None for interpreted timings, which are never speedups."""
    timing = (result.get("details") or {}).get("timing") or {}
    pick = lambda t: {k: t.get(k) for k in ("median_ms", "p20_ms", "p80_ms", "reps")} if t else None  # noqa: E731
    band: dict[str, Any] = {"candidate": {k: result.get(k) for k in ("median_ms", "p20_ms", "p80_ms")},
                            "eager": pick(timing.get("eager")), "compile": pick(timing.get("compile"))}
    for base in ("eager", "compile"):
        b, p80 = band[base], result.get("p80_ms")
        ok = (result.get("status") == "correct" and not result.get("interpreted") and b is not None
              and b.get("p20_ms") is not None and p80 is not None)
        band[f"win_{base}"] = bool(p80 < b["p20_ms"]) if ok else None
    return band


def problems_to_run(problem: Any, example_inputs: list | tuple | None, model_name: str | None) -> list[Problem]:
    """:func:`run`'s ``problem`` as Problems; a model is named ``model_name`` (``problem_name=``, else the
    campaign's ``name=``, which is the name the user gave it), else after its class."""
    import torch

    items = list(problem) if isinstance(problem, (list, tuple)) else [problem]
    problems: list[Problem] = []
    for item in items:
        if isinstance(item, Problem):
            problems.append(item)
        elif isinstance(item, torch.nn.Module):
            if example_inputs is None:
                raise CampaignError("a model needs example_inputs (a list of its forward's arguments)")
            problems.append(Problem.from_module(item, example_inputs, name=model_name or type(item).__name__))
        elif isinstance(item, (str, os.PathLike)):
            problems.append(load_problem(item))
        else:
            raise CampaignError(f"cannot run a {type(item).__name__}: give a file path, a Problem or a torch.nn.Module")
    return problems


def _same_campaign(store: Any, name: str, config: CampaignConfig, problems: list[Problem]) -> str | None:
    """The id of the campaign called ``name`` when it is this run's (same problems and settings), to go on
    with; None when there is none; a one-line :class:`CampaignError` when that name holds another."""
    camp = store.get_campaign(name)
    if camp is None or camp["name"] != name:  # get_campaign also matches ids and id prefixes
        return None
    old = camp["config"]
    if sorted(old.get("problem_ids") or []) != sorted(p.id for p in problems):
        raise CampaignError(f"campaign {name!r} in {store.path} ran other problems (another model, weights or file): "
                            "give another name=, or read its winner with kernellab.load_best")
    new = json.loads(canonical_json(asdict(config)))  # as stored: tuples are lists there
    differ = [k for k in new if k != "problems" and k in old and old[k] != new[k]]
    if differ:
        raise CampaignError(f"campaign {name!r} in {store.path} has other settings ("
                            + ", ".join(f"{k} {old[k]!r}, not {new[k]!r}" for k in differ)
                            + "): give another name=, or the same settings to go on with it")
    return camp["id"]


def run(problem: Any, example_inputs: list | tuple | None = None, *, db: str = "kernellab.db",
        name: str | None = None, progress: bool = False, executor: Any = None, **options: Any) -> dict:
    """Start a campaign and run it to the end of its budget: the Python form of ``kernellab run``.

    ``problem``: a problem file's path, a :class:`Problem`, a ``torch.nn.Module`` (with
    ``example_inputs``; wrapped by ``Problem.from_module``, named ``problem_name=`` or after its
    class), or a list of paths/Problems. ``options``: the fields of :class:`CampaignConfig`
    (``budget=``, ``llm=``, ``device=``, ...). Returns the store's summary of the campaign (its
    ``campaign`` row, ``best`` per problem, ...) and ``stops`` (problem -> why it stopped);
    ``kernellab.load_best(db, summary["campaign"]["name"])``
    then gives the winner. A ``name=`` that exists in ``db`` with the same problems and settings goes on with
    that campaign (a finished one returns its summary at once); with others it is a ``CampaignError``.
    Raises ``ProblemError``/``CampaignError`` (one line) on bad input."""
    _runtime.setup()  # the interpreter switch and the ast lock, before any work (kernellab._runtime)
    from kernellab.store import Store

    problem_name = options.pop("problem_name", None)
    unknown = sorted(set(options) - set(CampaignConfig.__dataclass_fields__) - {"problems"})
    if unknown:
        raise CampaignError(f"unknown option(s) {', '.join(unknown)}; the options are the fields of CampaignConfig")
    problems = problems_to_run(problem, example_inputs, problem_name or name)
    config = CampaignConfig(problems=[p.path or p.label for p in problems], **options)
    check_campaign(config, problems=problems)
    store = Store(db)
    cid = _same_campaign(store, name, config, problems) if name else None
    if cid is None:
        cid = start_campaign(store, config, name=name, problems=problems)
    elif store.get_campaign(cid)["status"] == "done":
        progress = False  # nothing to run: its summary as it stands
        summary = store.summary(cid)
        summary["stops"] = {e["payload"].get("problem"): e["payload"].get("reason") for e in store.events(cid, "stop")}
        return summary
    if not progress:
        summary = run_campaign(store, cid, executor=executor)
    else:
        from kernellab.progress import Progress

        with Progress() as prog:
            summary = run_campaign(store, cid, progress=prog, executor=executor)
    # why each problem stopped: the one place a caller without a terminal learns that, e.g., every
    # candidate timed out
    summary["stops"] = {e["payload"].get("problem"): e["payload"].get("reason") for e in store.events(cid, "stop")}
    return summary
