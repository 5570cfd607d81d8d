"""``kernellab.run``: a campaign over a file, a Problem or a model, in one call."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from kernellab import _runtime
from kernellab.campaign.config import CampaignConfig, CampaignError
from kernellab.campaign.running import check_campaign, run_campaign, start_campaign
from kernellab.problem import Problem, load_problem
from kernellab.vocab import canonical_json

if TYPE_CHECKING:
    pass


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
