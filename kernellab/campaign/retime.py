"""The winners, re-timed in fresh jobs at a campaign's end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernellab import _interrupt, env
from kernellab.campaign.config import CampaignConfig, CampaignError, _problems_of
from kernellab.problem import Problem
from kernellab.vocab import Kind

if TYPE_CHECKING:
    pass


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
