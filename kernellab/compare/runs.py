"""The runs a comparison is made of, read from the store: one (campaign, problem) each."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kernellab.vocab import counts_as_kernel_win

GROUPINGS = ("strategy", "policy", "agents", "prompts")
OBJECTIVE_LABELS = {"speedup_eager": "speedup vs eager", "speedup_compile": "speedup vs torch.compile"}
INTERPRETED_LABEL = "interpreted eager/candidate time ratio (Triton interpreter, CPU; not a speedup)"
REACH = 0.95
_COUNTED = ("full", "trial", "retime")


class CompareError(ValueError):
    """Nothing to compare, or bad input (an unknown study or campaign): one line, exit 2."""


@dataclass
class Run:
    """One (campaign, problem): its search trace and what it cost."""

    campaign_id: str
    campaign: str
    problem_id: str
    problem: str
    seed: int
    policy: str
    agents: str
    prompts: str | None
    objective: str
    finished: bool
    interpreted: bool = False
    # (evaluations so far, evaluation seconds so far, best so far or None)
    points: list[tuple[int, float, float | None]] = field(default_factory=list)
    final: float | None = None
    final_retimed: bool = False
    llm_calls: float = 0.0  # fractional where a multi-problem campaign's plan calls are shared
    input_tokens: float = 0.0
    output_tokens: float = 0.0
    usd: float = 0.0
    evaluations: int = 0  # full evaluations (one per candidate evaluated)
    failures: dict[str, int] = field(default_factory=dict)
    group: str = ""

    @property
    def best(self) -> float | None:
        return self.points[-1][2] if self.points else None

    @property
    def gpu_s(self) -> float:
        return self.points[-1][1] if self.points else 0.0



def _value(e: dict, objective: str) -> float | None:
    """The objective, or on the interpreter the interpreted eager/candidate time ratio
    (:func:`interpreted_ratio`); a GPU evaluation without the objective (no torch.compile timing) has no
    value, never the eager ratio in its place."""
    from kernellab.search import score_of

    if e.get("interpreted"):
        return interpreted_ratio(e)
    value, surrogate = score_of(e, objective)
    return None if surrogate else value


def interpreted_ratio(e: dict) -> float | None:
    """``eager_ms / median_ms`` of a correct interpreted evaluation: the one value the page plots and
    reports for it, curves and finals alike. Not the search's score, which prefers the cost model's
    H200 estimate where one was recorded: a winner's re-timing has none, so its final (0.24) and the
    curve (2.8-3.6 from the estimate) disagreed under one label."""
    eager, ms = e.get("eager_ms"), e.get("median_ms")
    return float(eager) / float(ms) if e.get("status") == "correct" and eager and ms else None


def _prompts_of(camp: dict, calls: list[dict]) -> str | None:
    """The content hash of the prompts a campaign used: as recorded when it started (``config.prompts``,
    or its study's), else from the versions its LLM calls carry (``<role>-<hash>``; campaigns from before
    the hash was recorded), else None (builtin agents read no prompt)."""
    from kernellab.problem import content_hash

    recorded = (camp["config"].get("study") or {}).get("prompts") or camp["config"].get("prompts")
    if recorded:
        return recorded
    versions = sorted({c["prompt_version"] for c in calls if c.get("prompt_version")})
    return content_hash(*versions, n=12) if versions else None


def _run(store: Any, camp: dict, pid: str, calls: list[dict], n_problems: int) -> Run:
    from kernellab.store import is_winner_retime

    cfg = camp["config"]
    objective = cfg.get("objective") or "speedup_eager"
    prob = store.get_problem(pid) or {"name": pid[:10]}
    cands = {c["id"] for c in store.candidates(camp["id"], pid)}
    run = Run(campaign_id=camp["id"], campaign=camp["name"], problem_id=pid, problem=prob["name"],
              seed=int(cfg.get("seed") or 0), policy=str(cfg.get("policy") or "greedy"),
              agents=str(cfg.get("llm") or "builtin"), prompts=_prompts_of(camp, calls), objective=objective,
              finished=camp["status"] == "done")
    n, t, best = 0, 0.0, None
    failures: Counter = Counter()
    for e in store.evaluations(campaign_id=camp["id"]):
        if e["candidate_id"] not in cands or e["kind"] not in _COUNTED or is_winner_retime(e):
            continue
        n += 1
        t += float((e.get("details") or {}).get("gpu_s") or 0.0)
        run.interpreted = run.interpreted or bool(e["interpreted"])
        if e["kind"] == "full":
            run.evaluations += 1
            if e["status"] != "correct":
                failures[e.get("error_class") or e["status"]] += 1
        if e["kind"] in ("full", "retime") and e["status"] == "correct" and counts_as_kernel_win(e):
            v = _value(e, objective)
            if v is not None and (best is None or v > best):
                best = v
        run.points.append((n, t, best))
    run.failures = dict(failures)
    reported = store.reported_best(camp["id"], pid, objective, library=False, kernel=True)
    if reported and counts_as_kernel_win(reported[0]) and _value(reported[0], objective) is not None:
        run.final, run.final_retimed = _value(reported[0], objective), bool(reported[0].get("retimed"))
    else:
        run.final = best
    # LLM calls: a one-problem campaign's are all the problem's; otherwise by candidate, and calls not
    # tied to a candidate (plans) shared evenly among the campaign's problems
    mine = [c for c in calls if n_problems == 1 or c.get("candidate_id") in cands]
    share = [] if n_problems == 1 else [c for c in calls if not c.get("candidate_id")]
    for group, w in ((mine, 1.0), (share, 1.0 / max(1, n_problems))):
        for c in group:
            run.llm_calls += w
            run.input_tokens += w * int(c.get("input_tokens") or 0)
            run.output_tokens += w * int(c.get("output_tokens") or 0)
            run.usd += w * float(c.get("cost_usd") or (c.get("response") or {}).get("replayed_cost_usd") or 0.0)
    return run


def collect(store: Any, *, study: str | None = None, campaigns: tuple[str, ...] | list[str] = ()) -> tuple[list[Run], dict]:
    """The runs of a study (its recorded matrix) or of the given campaigns, and what was left out."""
    if bool(study) == bool(campaigns):
        raise CompareError("give --study NAME or one or more CAMPAIGNs (not both)")
    chosen: list[tuple[dict, list[str]]] = []
    meta: dict[str, Any] = {"study": study, "missing": [], "unfinished": []}
    if study:
        from kernellab.study import cell_campaigns

        row = store.get_study(study)
        if row is None:
            known = ", ".join(s["name"] for s in store.list_studies()) or "none"
            raise CompareError(f"no study {study!r} in {store.path} (studies: {known})")
        cfg = row["config"]
        meta.update(suite=cfg["suite"], shared=cfg.get("shared"), cells=len(cfg["cells"]),
                    problems=[p["name"] for p in cfg["problems"]])
        pids = [p["id"] for p in cfg["problems"]]
        names = {p["id"]: p["name"] for p in cfg["problems"]}
        for entry in cfg["cells"]:
            camps = cell_campaigns(store, entry, pids)
            for pid in pids:
                if pid not in camps:
                    meta["missing"].append({"cell": entry["key"], "problem": names[pid]})
                else:
                    chosen.append((camps[pid], [pid]))
    else:
        for ref in campaigns:
            camp = store.get_campaign(ref)
            if camp is None:
                raise CompareError(f"no campaign {ref!r} in {store.path}")
            chosen.append((camp, list(camp["config"].get("problem_ids") or [])))
    runs = []
    for camp, pids in chosen:
        calls = store.llm_calls(camp["id"])
        n_problems = len(camp["config"].get("problem_ids") or pids)
        for pid in pids:
            run = _run(store, camp, pid, calls, n_problems)
            if not run.finished:
                meta["unfinished"].append({"campaign": camp["name"], "problem": run.problem, "status": camp["status"]})
            runs.append(run)
    return runs, meta
