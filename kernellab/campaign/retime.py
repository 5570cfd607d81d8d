"""The winners, re-timed in fresh jobs at a campaign's end."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kernellab import _interrupt, env
from kernellab.campaign.config import CampaignConfig, CampaignError, _problems_of
from kernellab.problem import Problem
from kernellab.vocab import DEFAULT_OBJECTIVE, Kind, Status, harness_oom

if TYPE_CHECKING:
    pass


# error classes of a job the sandbox could not run at all: they say nothing about the candidate
_INFRA = ("shutdown", "worker_start", "sandbox")
# what a campaign's end re-times (store.best's selection rules): each problem's winner, and its best kernel win
# where that is another candidate
WINNER, KERNEL_WIN = {}, {"library": False, "kernel": True}


def retimes_missing(store: Any, camp: dict, attempts: int = 3) -> list[str]:
    """The problems of ``camp`` whose winner or best kernel win has no winner re-timing (campaigns finished
    before the kernel win was re-timed too), but not those with ``attempts`` failed re-timings already: what
    running the campaign again re-times (its graph done, ``run_campaign`` goes straight to the re-timing)."""
    from kernellab.store import is_winner_retime

    objective = (camp.get("config") or {}).get("objective") or DEFAULT_OBJECTIVE
    retimes = [e for e in store.evaluations(campaign_id=camp["id"], kind=Kind.RETIME)
               if is_winner_retime(e) and not harness_oom(e)]
    out = []
    for pid in (camp.get("config") or {}).get("problem_ids") or []:
        sels = [rows[0] for rule in (WINNER, KERNEL_WIN) if (rows := store.best(camp["id"], pid, objective, **rule))]
        if all(any((e["candidate_id"], e["config_json"]) == (s["candidate_id"], s["config_json"]) for e in retimes)
               for s in sels):
            continue
        mine = {c["id"] for c in store.candidates(camp["id"], pid)}
        if sum(e["status"] != Status.CORRECT and e["candidate_id"] in mine for e in retimes) < attempts:
            out.append(pid)
    return out


def retime_winners(store: Any, campaign: str, *, executor: Any = None, problem: str | None = None,
                   force: bool = False, attempts: int = 3) -> list[dict]:
    """Re-time each problem's winner (``store.best`` under the campaign's objective) in a fresh job:
    the candidate, eager and (on CUDA) torch.compile timed interleaved in that one job
    (``EvalJob(retime=True)``), recorded as a ``retime`` evaluation marked ``details.winner_retime``
    with the p20/p80 of each and whether the candidate's p80 is below each baseline's p20.

    The best of many evaluations is biased up by noise; this one number is not, and it is what the
    store's ``reported_best`` returns. A winner whose re-timing is not correct (e.g. wrong on the
    new job's inputs) is out, and the next best is re-timed, up to ``attempts`` per problem. A winner
    re-timed already is skipped unless ``force``. Where the winner is not a kernel win (library-only, or
    mostly library time), the best kernel win is re-timed too: a benchmark prints that one. Returns one
    outcome per problem, and one more (``"selection": "kernel win"``) for each such second winner."""
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
    """The winner of each problem (a library-only one too: what a user is given), then, where that is not it,
    the best kernel win (``vocab.counts_as_kernel_win``: what a benchmark counts and prints): both numbers
    are printed, so both are re-timed. The second's outcomes are marked ``"selection": "kernel win"``."""
    winners = _retime_pass(store, camp, config, problems, executor, device, force, attempts, WINNER)
    done = {pid: (o.get("candidate_id"), o.get("config_json")) for pid, o in winners.items()}
    kernel = _retime_pass(store, camp, config, problems, executor, device, force, attempts, KERNEL_WIN, skip=done)
    out = []
    for pid in problems:
        out += [winners[pid]] if pid in winners else []
        if pid in kernel and kernel[pid].get("candidate_id"):
            out.append({**kernel[pid], "selection": "kernel win"})
    return [{k: v for k, v in o.items() if k != "config_json"} for o in out]


def _retime_pass(store: Any, camp: dict, config: CampaignConfig, problems: dict[str, Problem], executor: Any,
                 device: str, force: bool, attempts: int, rule: dict,
                 skip: dict[str, tuple] | None = None) -> dict[str, dict]:
    """One selection rule's re-timings (``rule``: ``store.best``'s ``library``/``kernel``), problem by problem;
    a problem whose selection is ``skip``'s (candidate, config) for it is left out (re-timed by the pass before)."""
    from kernellab import sandbox
    from kernellab.store import WINNER_RETIME, is_winner_retime

    out: dict[str, dict] = {}
    tries = dict.fromkeys(problems, 0)
    while tries:
        jobs = {}
        for pid in list(tries):
            name = problems[pid].name
            rows = store.best(camp["id"], pid, config.objective, **rule)
            if not rows:
                out.setdefault(pid, {"problem": name, "outcome": "no correct candidate"})
                del tries[pid]
                continue
            sel = rows[0]
            if skip is not None and skip.get(pid) == (sel["candidate_id"], sel["config_json"]):
                out.pop(pid, None)  # the pass before re-timed it (a failed try of this pass stays out too)
                del tries[pid]
                continue
            every = [e for e in store.evaluations(candidate_id=sel["candidate_id"], kind=Kind.RETIME)
                     if is_winner_retime(e) and e["config_json"] == sel["config_json"]]
            earlier = [e for e in every if not harness_oom(e)]  # one that ran out beside our outputs: again
            if earlier and not (force and tries[pid] == 0):
                out[pid] = {"problem": name, "candidate_id": sel["candidate_id"], "evaluation_id": earlier[-1]["id"],
                            "outcome": "re-timed before", "config_json": sel["config_json"]}
                del tries[pid]
                continue
            if tries[pid] >= attempts:
                out[pid] = {"problem": name, "outcome": f"gave up: {attempts} winners in a row failed their re-timing"}
                del tries[pid]
                continue
            cand = store.get_candidate(sel["candidate_id"])
            job = sandbox.EvalJob(problems[pid], cand["source"], config=sel.get("config") or None, small=config.small,
                                  device=device, trials=config.trials, store=store, retime=True)
            jobs[pid] = (sel, len(every), executor.submit(job))
        for pid, (sel, n, fut) in jobs.items():
            tries[pid] += 1
            try:
                result = dict(fut.result())
            except Exception as exc:  # the executor failed on it: nothing is known about the candidate
                result = {"status": "crash", "error_class": "sandbox", "error_text": f"{type(exc).__name__}: {exc}"}
            row = {"problem": problems[pid].name, "candidate_id": sel["candidate_id"], "status": result.get("status"),
                   "config_json": sel["config_json"]}
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
    return out


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
