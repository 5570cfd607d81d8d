"""Commands that inspect a store (status, show, lineage) and evaluate one file (eval)."""

from __future__ import annotations

import json
import sys

import click

from kernellab.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageFailure,
    _errors,
    _store,
    db_option,
    emit,
    json_option,
    resume_hint,
)


@click.command()
@click.argument("campaign", required=False)
@db_option
@json_option
@_errors
def status(campaign: str | None, db: str, as_json: bool) -> None:
    """Campaigns in the store, or one CAMPAIGN's summary (best per problem, statuses, LLM cost).

    The best per problem is its re-timed winner with its p20-p80 band. A campaign marked running whose
    process is gone shows as `running (stale: no process)` ("stale": true in --json), with the command
    that resumes it."""
    from kernellab import views
    from kernellab.campaign import is_stale

    store = _store(db)
    if campaign is None:
        rows = [{**r, "stale": is_stale(store, r)} for r in store.list_campaigns()]
        emit(rows, as_json, views.print_campaigns)
        if any(r["stale"] for r in rows) and not as_json:
            click.echo("stale: marked running, but no process holds it (killed or crashed); "
                       f"{resume_hint('NAME', db)} goes on", err=True)
        return
    camp = store.get_campaign(campaign)
    if camp is None:
        raise UsageFailure(f"no campaign {campaign!r} in {db}")
    summary = store.summary(camp["id"])
    summary["campaign"]["stale"] = is_stale(store, summary["campaign"])
    emit(summary, as_json, views.print_summary)
    if summary["campaign"]["stale"] and not as_json:
        click.echo(f"its process is gone (killed or crashed): {resume_hint(camp['name'], db)} goes on", err=True)


@click.command()
@click.argument("candidate")
@db_option
@json_option
@click.option("--source/--no-source", default=True, help="Print the candidate's source.")
@_errors
def show(candidate: str, db: str, as_json: bool, source: bool) -> None:
    """One CANDIDATE (id or unique prefix): its action, evaluations, metrics and source."""
    from kernellab import views

    store = _store(db)
    cand = store.get_candidate(candidate)
    if cand is None:
        raise UsageFailure(f"no candidate {candidate!r} in {db} (or the prefix is ambiguous)")
    evals = store.evaluations(candidate_id=cand["id"])
    for e in evals:
        e["metrics"] = store.metrics(e["id"])
    from kernellab.problem import declared_mode

    prob = store.get_problem(cand["problem_id"]) or {}
    from kernellab.small import recorded_instances

    obj = {"candidate": cand, "evaluations": evals,
           "problem": {"id": cand["problem_id"], "name": prob.get("name"),
                       "mode": declared_mode(prob.get("source") or ""), "instances": recorded_instances(evals)}}
    emit(obj, as_json, lambda o: views.print_candidate(o, source=source))


@click.command()
@click.argument("candidate")
@db_option
@json_option
@_errors
def lineage(candidate: str, db: str, as_json: bool) -> None:
    """The path from the root to CANDIDATE: each step's action and its best evaluation."""
    from kernellab import views
    from kernellab.vocab import JUDGED

    store = _store(db)
    cand = store.get_candidate(candidate)
    if cand is None:
        raise UsageFailure(f"no candidate {candidate!r} in {db} (or the prefix is ambiguous)")
    steps = []
    for c in store.lineage(cand["id"]):
        evals = [e for e in store.evaluations(candidate_id=c["id"]) if e["kind"] in JUDGED]
        steps.append({"id": c["id"], "depth": c["depth"], "action": c["action"], "origin": c["origin"],
                      "evaluations": [{k: e[k] for k in ("status", "median_ms", "speedup_eager",
                                                         "speedup_compile", "interpreted", "config")}
                                      for e in evals]})
    emit(steps, as_json, views.print_lineage)



@click.command("eval")
@click.argument("problem", type=click.Path())
@click.argument("candidate_file", type=click.Path())
@click.option("--config", "config_json", default=None, metavar="JSON",
              help="Values for the candidate's CONFIG, e.g. '{\"BLOCK\": 256}'.")
@click.option("--small", is_flag=True, help="Use the problem's SMALL sizes (automatic on CPU).")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@click.option("--trials", default=5, show_default=True, help="Correctness trials with fresh inputs.")
@click.option("--no-timing", is_flag=True, help="Check correctness and integrity only.")
@json_option
@_errors
def eval_(problem: str, candidate_file: str, config_json: str | None, small: bool, device: str,
          trials: int, no_timing: bool, as_json: bool) -> None:
    """Evaluate CANDIDATE_FILE against PROBLEM in the sandbox and print the result.

    Exit 0 when the candidate is `correct`, 1 when it was evaluated and is not, 2 on bad input
    (a problem that cannot judge it included: its reference failed, or a null output would pass).
    """
    from pathlib import Path

    from kernellab import views
    from kernellab.problem import load_problem

    if trials < 1:
        raise UsageFailure(f"--trials must be at least 1 (correctness trials), got {trials}")
    prob = load_problem(problem)
    path = Path(candidate_file)
    if not path.is_file():
        raise UsageFailure(f"{candidate_file}: no such file")
    try:
        config = json.loads(config_json) if config_json else None
    except json.JSONDecodeError as exc:
        raise UsageFailure(f"--config is not valid JSON: {exc}") from None
    if config is not None and not isinstance(config, dict):
        raise UsageFailure("--config must be a JSON object")
    try:
        from kernellab.sandbox import SandboxError, evaluate
    except ImportError as exc:
        raise UsageFailure(f"the sandbox is not available in this build ({exc})") from None
    try:
        result = evaluate(prob, path.read_text(), config=config, small=small or None,
                          device=None if device == "auto" else device, trials=trials, timing=not no_timing)
    except SandboxError as exc:  # e.g. --device cuda on a machine without one
        raise UsageFailure(str(exc)) from None
    if result.get("error_class") == "problem":  # the problem's fault, not the candidate's: bad input
        if as_json:
            emit(result, as_json, views.print_eval)
        raise UsageFailure((result.get("error_text") or "the problem failed in the sandbox").splitlines()[0])
    emit(result, as_json, views.print_eval)
    sys.exit(EXIT_OK if result["status"] == "correct" else EXIT_FAILED)
