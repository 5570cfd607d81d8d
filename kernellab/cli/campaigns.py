"""Commands of campaigns: run, resume, retime, report, export."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from kernellab.cli._common import (
    EXIT_FAILED,
    UsageFailure,
    _campaign_options,
    _cluster_executor,
    _errors,
    _finish,
    _interruptible,
    _store,
    db_option,
    emit,
    json_option,
)
from kernellab.vocab import OBJECTIVES


@click.command()
@click.argument("problems", nargs=-1, required=True, type=click.Path())
@_campaign_options
@click.option("--cluster", default=None, metavar="ADDRESS", help="Evaluate on a Dask cluster (see `kernellab bench`).")
@click.option("--campaign", "name", default=None, metavar="NAME", help="Campaign name (default: problems + time).")
@db_option
@json_option
@_errors
def run(problems: tuple[str, ...], name: str | None, db: str, as_json: bool, device: str, cluster: str | None = None,
        **opts: Any) -> None:
    """Start a campaign over PROBLEM files and run it to the end of its budget.

    Prints the best candidate per problem; exit 1 when no problem got a correct candidate.
    A stopped or killed campaign continues with `kernellab resume NAME`.
    """
    from kernellab import _runtime
    from kernellab.campaign import CampaignConfig, CampaignError, check_campaign, run_campaign, start_campaign

    _runtime.stamp("imported", first=True)
    config = CampaignConfig(problems=list(problems), device=None if device == "auto" else device, **opts)
    try:
        # checked before the database is opened, so that bad input writes nothing
        checked = check_campaign(config, store=_store(db) if config.replay else None)
    except CampaignError as exc:
        raise UsageFailure(str(exc)) from None
    _runtime.stamp("checked")
    # the cluster too: one that cannot be reached, or has no worker for the device, writes nothing
    executor = _cluster_executor(cluster, slots=max(1, opts.get("width") or 1), device=config.device)
    with _shut_down_after(executor or _local_executor(config.device)) as executor:
        try:
            store = _store(db, must_exist=False)
            cid = start_campaign(store, config, name=name, problems=checked)
        except CampaignError as exc:
            raise UsageFailure(str(exc)) from None
        _runtime.stamp("started")
        summary = _with_panel(executor, as_json, store, cid,
                              lambda progress: run_campaign(store, cid, progress=progress, executor=executor))
    _finish(summary, as_json, store)


def _local_executor(device: str | None) -> Any:
    """The campaign's local executor, made and warmed once the input is checked: its workers (and on a GPU an
    Nsight Compute target) start while the campaign is written and the graph's modules load, 2.6 s of a solo
    run's 10 s start-up on the H200 that its first evaluation waited for."""
    from kernellab import _runtime, env
    from kernellab.campaign.running import campaign_executor

    executor = campaign_executor(device or env.default_device())
    _runtime.stamp("warmed")
    return executor


@contextlib.contextmanager
def _shut_down_after(executor: Any) -> Iterator[Any]:
    """``executor`` (a cluster's, the campaign's local one, or None), shut down at the block's end, also when the
    campaign could not start; after an error or a signal without waiting for the jobs in flight (a finished
    evaluation is in the store already, `resume` runs the others again)."""
    try:
        yield executor
    except BaseException:
        if executor is not None:
            executor.shutdown(wait=False)
        raise
    if executor is not None:
        executor.shutdown()


def _with_panel(executor: Any, as_json: bool, store: Any, cid: str, work: Callable[[Any], dict]) -> dict:
    """``work(progress)`` under the live panel (none with --json), stopped resumably by a signal or an LLM stop
    (``_interruptible``); a ``CampaignError`` then (``CampaignBusy``: another process resumed it) is a usage error."""
    from kernellab.campaign import CampaignError
    from kernellab.progress import Progress

    try:
        with Progress(enabled=None if not as_json else False) as progress:
            if executor is not None:
                executor.progress = progress
            return _interruptible(lambda: work(progress), store, cid, progress)
    except CampaignError as exc:
        raise UsageFailure(str(exc)) from None


@click.command()
@click.argument("campaign")
@click.option("--usd-budget", type=float, default=None, metavar="DOLLARS",
              help="A new LLM dollar budget for the whole campaign (after a stop for a spent budget).")
@click.option("--cluster", default=None, metavar="ADDRESS",
              help="Go on evaluating on a Dask cluster (tcp://HOST:8786 or local[:N]; see `kernellab bench`), whatever "
                   "the campaign ran on before.")
@db_option
@json_option
@_errors
def resume(campaign: str, usd_budget: float | None, db: str, as_json: bool, cluster: str | None = None) -> None:
    """Continue CAMPAIGN (name or id) after a stop, a crash or kill -9: finished evaluations are kept,
    none is run twice, and the campaign reaches the budget it was given."""
    from kernellab.campaign import resume_campaign

    store = _store(db)
    camp = store.get_campaign(campaign)
    if camp is None:
        raise UsageFailure(f"no campaign {campaign!r} in {db}")
    config = camp.get("config") or {}
    # checked before any work, as for run: a cluster that cannot be reached or lacks the device's workers
    with _shut_down_after(_cluster_executor(cluster, slots=max(1, config.get("width") or 1),
                                            device=config.get("device"))) as executor:
        summary = _with_panel(executor, as_json, store, camp["id"], lambda progress: resume_campaign(
            store, camp["id"], progress=progress, executor=executor, usd_budget=usd_budget))
    _finish(summary, as_json, store)


@click.command()
@click.argument("campaign")
@click.option("--problem", default=None, metavar="P", help="Only this problem (name or id).")
@click.option("--force", is_flag=True, help="Re-time winners that were re-timed before, once more.")
@db_option
@json_option
@_errors
def retime(campaign: str, problem: str | None, force: bool, db: str, as_json: bool) -> None:
    """Re-time each problem's winner of CAMPAIGN in a fresh job (candidate, eager and torch.compile
    interleaved): the number status, report, export and bench print.

    Where the winner is not a kernel win, the best kernel win too (the one bench counts). Campaigns do it at
    their end; this does it on demand. Prints the summary; exit 1 when no problem has a
    correct candidate."""
    from kernellab.campaign import CampaignError, campaign_lock, retime_winners

    store = _store(db)
    camp = store.get_campaign(campaign)
    if camp is None:
        raise UsageFailure(f"no campaign {campaign!r} in {db}")
    try:
        with campaign_lock(store, camp["id"], camp["name"]):  # not while a run of it adds candidates
            outcomes = retime_winners(store, camp["id"], problem=problem, force=force)
    except CampaignError as exc:
        raise UsageFailure(str(exc)) from None
    summary = store.summary(camp["id"])
    summary["retime"] = outcomes
    if not as_json:
        for o in outcomes:
            click.echo(f"{o['problem']}{' (' + o['selection'] + ')' if o.get('selection') else ''}: {o['outcome']}")
    _finish(summary, as_json)


@click.command()
@click.argument("campaign")
@click.option("-o", "--output", "output", default="kernellab-report.html", show_default=True, metavar="FILE",
              help="Where to write the HTML file.")
@click.option("--objective", type=click.Choice(list(OBJECTIVES)), default=None,
              help="Choose the best candidates by this speedup [default: the campaign's --objective].")
@db_option
@json_option
@_errors
def report(campaign: str, output: str, objective: str | None, db: str, as_json: bool) -> None:
    """Write the HTML report of a CAMPAIGN: one self-contained file (no network needed) with
    speedups, progress, lineage, tree, roofline, failures, LLM cost and the best source."""
    from kernellab import report as report_mod

    store = _store(db)
    camp = store.get_campaign(campaign)
    if camp is None:
        raise UsageFailure(f"no campaign {campaign!r} in {db}")
    path = report_mod.write(store, camp["id"], output, objective)
    emit({"campaign": camp["id"], "report": str(path)}, as_json,
         lambda o: click.echo(f"report of {camp['name']} written to {o['report']}"))


@click.command()
@click.argument("campaign")
@click.option("--problem", default=None, metavar="P",
              help="Problem name or id (needed when the campaign has several problems).")
@click.option("-o", "--output", "output", default=None, metavar="FILE",
              help="Where to write the .py file [default: exports/best_<problem>.py].")
@db_option
@json_option
@_errors
def export(campaign: str, problem: str | None, output: str | None, db: str, as_json: bool) -> None:
    """Export the best kernel of a CAMPAIGN (its re-timed winner) as one standalone .py file with its
    tuned CONFIG, loadable with the original model's state_dict.

    Exit 1 when the problem has no correct candidate."""
    from kernellab import export as export_mod

    store = _store(db)
    try:
        path, best = export_mod.export(store, campaign, problem, output)
    except export_mod.NoCorrectCandidate as exc:
        click.echo(f"kernellab: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    except export_mod.ExportError as exc:
        raise UsageFailure(str(exc)) from None
    e = best["evaluation"]
    obj = {"path": str(path), "campaign": best["campaign"]["id"], "problem": best["problem"]["name"],
           "candidate": best["candidate"]["id"], "evaluation": e["id"], "config": e.get("config") or {},
           "interpreted": bool(e["interpreted"]), "speedup_eager": None if e["interpreted"] else e["speedup_eager"],
           "speedup_compile": None if e["interpreted"] else e["speedup_compile"],
           "retimed": e["retimed"], "median_ms": e["median_ms"], "p20_ms": e["p20_ms"], "p80_ms": e["p80_ms"],
           "speedup_eager_p20_p80": e["speedup_eager_p20_p80"], "speedup_compile_p20_p80": e["speedup_compile_p20_p80"],
           "win_eager": e["win_eager"], "win_compile": e["win_compile"]}
    emit(obj, as_json, lambda o: click.echo(f"best candidate {o['candidate'][:12]} of {o['problem']} "
                                            f"written to {o['path']}"))
