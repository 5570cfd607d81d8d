"""The budget loop: ``optimize`` runs the tasks' campaigns within one budget, then patches, checks and times."""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from kernellab import _runtime
from kernellab.problem import ProblemError
from kernellab.wholemodel.patching import patch
from kernellab.wholemodel.profiling import profile_units
from kernellab.wholemodel.splitting import split
from kernellab.wholemodel.tasks import make_tasks, start_task
from kernellab.wholemodel.timing import time_models
from kernellab.wholemodel.units import OptimizeError


def optimize(model: nn.Module, example_inputs: list | tuple, *, db: str = "kernellab.db", name: str | None = None,
             budget: int = 16, time_budget_s: float | None = None, max_heavy: int = 4, min_share: float = 0.01,
             per_problem: int | None = None, verify: bool = True, compare: bool = True, executor: Any = None,
             progress: Any = None, log: Callable[[str], None] | None = None, **options: Any) -> dict:
    """Optimize a whole model: split, dedupe, rank, one campaign per problem, patch, check, time.

    ``budget``: candidates over all problems together; ``time_budget_s``: wall time over all of them;
    ``gpu_budget_s`` and ``usd_budget`` (options): GPU-seconds and LLM dollars over all of them;
    ``per_problem``: a cap per problem (default: the budget shared by time share, at least 2 each);
    ``min_share``: problems below this share of the model's time are left to PyTorch; ``options``: the
    other fields of :class:`kernellab.campaign.CampaignConfig` (``llm=``, ``device=``, ``trials=``...).

    Returns a report: per problem its units, share before and after, campaign, winner and lineage; the
    patched model (``report["model"]``, see :func:`patch`: loading the winners runs their code in this
    process, which calling ``optimize`` accepts); end to end the check and the timings of eager, the
    patched model and torch.compile (GPU only; on a CPU kernels are interpreted and no speedup is claimed).
    A rerun into the same ``db`` skips the problems whose campaign finished."""
    _runtime.setup()  # the interpreter switch and the ast lock, before any work (kernellab._runtime)
    from kernellab import env, sandbox
    from kernellab.campaign import CampaignConfig, CampaignError, check_campaign, run_campaign
    from kernellab.store import Store

    if not isinstance(model, nn.Module):
        raise OptimizeError(f"model is a {type(model).__name__}, not a torch.nn.Module")
    inputs = list(example_inputs)
    if budget < 1:
        raise OptimizeError(f"budget must be at least 1, got {budget}")
    unknown = sorted(set(options) - set(CampaignConfig.__dataclass_fields__) - {"problems", "budget", "time_budget_s"})
    if unknown:
        raise OptimizeError(f"unknown option(s) {', '.join(unknown)}; the options are the fields of CampaignConfig")
    # GPU-seconds and LLM dollars are totals over all problems, like the candidates and the wall time: each
    # new campaign gets what the campaigns before it (finished earlier ones too) left
    totals = {k: v for k in ("gpu_budget_s", "usd_budget") if (v := options.pop(k, None)) is not None}
    for k, v in totals.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise OptimizeError(f"{k} must be a positive number, got {v!r}")
    say = log or (lambda s: None)
    name = name or type(model).__name__
    t_start = time.monotonic()
    # profiling and timing call the model many times: on a copy, so that a training-mode model's
    # BatchNorm statistics are the user's own afterwards
    work = copy.deepcopy(model)
    units = split(work, max_heavy=max_heavy)
    prof = profile_units(work, inputs, units)
    tasks, skipped = make_tasks(name, units, prof)
    store = Store(db)
    device = options.get("device") or env.default_device()
    warning = interpreted_size_warning(inputs, device)
    if warning:
        say(warning)
    eligible = [t for t in tasks if t.share >= min_share]
    for t in tasks:
        if t.share < min_share:
            t.outcome = f"left to PyTorch: {t.share:.1%} of the model's time is below min_share {min_share:.0%}"
    total_share = sum(t.share for t in eligible) or 1.0
    spent = 0
    used = dict.fromkeys(totals, 0.0)  # of each total, what this model's campaigns spent (finished before or run now)
    own = executor is None
    executor = executor or sandbox.LocalExecutor()
    failed = True
    try:
        # a problem's campaign is found by its key, whatever the model was named (or which model it was)
        by_key = {c["config"]["optimize"].get("key"): c for c in store.list_campaigns()
                  if (c.get("config") or {}).get("optimize")}
        for t in eligible:
            camp = by_key.get(t.key) or store.get_campaign(t.campaign)
            if camp is not None:
                t.campaign = camp["name"]
            if camp is not None and camp["status"] == "done":
                t.outcome = "finished before (skipped)"
                t.budget = camp["config"].get("budget", 0)
                spent += len(store.candidates(camp["id"]))
                _add_usage(used, store, camp["id"])
                say(f"{t.campaign}: finished before, skipped")
                continue
            left_s = None if time_budget_s is None else time_budget_s - (time.monotonic() - t_start)
            if left_s is not None and left_s <= 0:
                t.outcome = "not run: the time budget was spent on the problems ranked above"
                continue
            left = {k: v - used[k] for k, v in totals.items()}
            out = [k for k, v in left.items() if v <= 0]
            if out:
                t.outcome = f"not run: the {_BUDGET_WORDS[out[0]]} budget was spent on the problems ranked above"
                continue
            if camp is None:
                share_budget = max(2, math.floor(budget * t.share / total_share))
                want = min(per_problem or share_budget, budget - spent)
                if want < 1:
                    t.outcome = "not run: the candidate budget was spent on the problems ranked above"
                    continue
                t.budget = want
                config = CampaignConfig(problems=[t.problem.label], budget=want, time_budget_s=left_s, **left,
                                        **{k: v for k, v in options.items() if k not in ("budget", "time_budget_s")})
                try:
                    check_campaign(config, problems=[t.problem])
                except (CampaignError, ProblemError) as exc:
                    t.outcome = f"not run: {exc}"
                    continue
                cid = start_task(store, t, config, max_heavy=max_heavy, model_name=name)
            else:
                cid = camp["id"]
                t.budget = camp["config"].get("budget", 0)
            say(f"{t.campaign}: {t.share:.1%} of the model's time, {len(t.units)} unit(s), budget {t.budget}")
            run_campaign(store, cid, executor=executor, progress=progress)
            spent += len(store.candidates(cid))
            _add_usage(used, store, cid)
            t.outcome = "ran"
        failed = False
    finally:
        if own:  # after an error nothing reads the jobs in flight: their workers are killed, not waited for
            executor.shutdown(wait=not failed)
    patched = patch(model, store, example_inputs=inputs if verify else None)
    result = {"model": patched, "name": name, "db": str(db), "device": device, "interpreted": device != "cuda",
              "total_ms": prof["total_s"] * 1e3, "budget": budget, "candidates_spent": spent,
              "units": [u.label for u in units], "skipped": skipped, "check": patched.kernellab_check,
              "problems": []}
    applied = {p["unit"]: p for p in patched.kernellab_patches}
    probe = copy.deepcopy(patched)
    after = profile_units(probe, inputs, split(probe, max_heavy=max_heavy)) if applied else None
    for t in tasks:
        row = t.record()
        row["share_after"] = None
        if after is not None:
            row["share_after"] = sum(after["share"].get(u.label, 0.0) for u in t.units)
        row.update(_winner(store, t.campaign))
        row["patched"] = [u.label for u in t.units if applied.get(u.label, {}).get("status") == "kernel"]
        # why a unit with a winner still runs PyTorch (weights, speed, its own check, the end-to-end check)
        row["kept"] = {u.label: applied[u.label]["reason"] for u in t.units
                       if applied.get(u.label, {}).get("status") == "pytorch" and applied[u.label].get("reason")}
        result["problems"].append(row)
    # the share of the model's time that now runs a winner (a problem's share split evenly over its units), and
    # of it what our kernels carry: a winner's own-kernel share of its GPU time, measured when it was judged
    # (KB 4's conv1 winner was cuDNN plus one Triton kernel with 9% of its time: patched, but hardly ours)
    result["patched_share"] = sum(r["share"] * len(r["patched"]) / len(r["units"]) for r in result["problems"])
    # None on the interpreter: its own-kernel share is Python wall time, not GPU time (vocab.counts_as_kernel_win), and a
    # whole-model winner read as 11-14% "of the model's time"
    result["covered_share"] = None if result["interpreted"] else sum(
        r["share"] * len(r["patched"]) / len(r["units"]) * ((r.get("winner") or {}).get("own_kernel_share") or 0.0)
        for r in result["problems"])
    if compare:
        result["timing"] = time_models(work, copy.deepcopy(patched), inputs)
    return result


_BUDGET_WORDS = {"gpu_budget_s": "GPU-second", "usd_budget": "LLM dollar"}
_USAGE_FIELD = {"gpu_budget_s": "gpu_s", "usd_budget": "llm_usd"}  # a CampaignConfig budget -> its search.Usage field


def _add_usage(used: dict[str, float], store: Any, campaign_id: str) -> None:
    """Adds a finished campaign's spending to ``used`` (keyed by budget field), counted as the campaign's own
    budget counts it (``search.Usage``); read once, as the campaign ends."""
    if not used:
        return
    from kernellab.search import Usage

    u = Usage.from_store(store, campaign_id)
    for k in used:
        used[k] += getattr(u, _USAGE_FIELD[k])


def interpreted_size_warning(inputs: list, device: str) -> str | None:
    """One line when the model's inputs are too large for the Triton interpreter: its subgraphs' evaluations
    then run at those sizes on the CPU, minutes each (a KernelBench ResNet block at 224x224: over 4 minutes for
    one). None on a GPU or for small inputs."""
    from torch.utils._pytree import tree_leaves

    from kernellab.small import SMALL_ELEMENT_LIMIT

    if str(device).startswith("cuda"):
        return None
    n = sum(t.numel() for t in tree_leaves(inputs) if isinstance(t, torch.Tensor))
    if n <= SMALL_ELEMENT_LIMIT:
        return None
    return (f"warning: the inputs hold {n:,} elements and the kernels run in the Triton interpreter on the CPU: "
            "each evaluation can take minutes; pass smaller inputs (a factory or inputs function with a `small` "
            "parameter gets the CPU size) or run on a GPU")


def _failure_text(text: str | None, limit: int = 300) -> str:
    """A failed evaluation's text for the report: a traceback's last ``limit`` characters (the exception
    and its message; its head, the sandbox's own frames, said nothing on the H200: "Traceback (most recent
    call last): File kernellab/sandbox/_job.py ..."), anything else's first."""
    text = (text or "").strip()
    if text.startswith("Traceback") and len(text) > limit:
        return "..." + text[-limit:].replace("\n", " ")
    return text[:limit].replace("\n", " ")


def _winner(store: Any, campaign: str | None) -> dict:
    camp = store.get_campaign(campaign) if campaign else None
    if camp is None:
        return {"winner": None}
    best = store.reported_best(camp["id"])
    # what went wrong, for a campaign without a win: the first three failures, each in the judge's words
    failures = [f"{e['error_class'] or e['status']}: {_failure_text(e['error_text'])}"
                for e in store.evaluations(campaign_id=camp["id"]) if e["status"] != "correct"][:3]
    if not best:
        return {"winner": None, "status": camp["status"], "failures": failures}
    e = best[0]
    lineage = [{"id": c["id"][:12], "action": c["action"] or "(root)", "origin": c["origin"]}
               for c in store.lineage(e["candidate_id"])]
    return {"status": camp["status"], "failures": failures, "winner": {
        "candidate": e["candidate_id"], "evaluation": e["id"], "interpreted": bool(e["interpreted"]),
        "median_ms": e["median_ms"], "speedup_eager": None if e["interpreted"] else e["speedup_eager"],
        "speedup_compile": None if e["interpreted"] else e["speedup_compile"], "retimed": e.get("retimed"),
        "own_kernel_share": e.get("own_kernel_share"), "lineage": lineage}}
