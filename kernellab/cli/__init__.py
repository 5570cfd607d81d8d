"""The ``kernellab`` command line: each command is a short function over the library.

Exit codes (README.md "Commands"): 0 success, 1 the work failed (e.g. no correct candidate), 2 bad usage or
bad input. ``--json`` on every command prints one JSON document on stdout instead of tables.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from .campaign import TUNE_TRIALS_MAX, TUNE_TRIALS_MIN, CampaignConfig
from .problem import ProblemError
from .vocab import OBJECTIVES

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UsageFailure(Exception):
    """Bad input found after argument parsing: printed as one line, exit 2."""


def _errors(fn: Callable) -> Callable:
    """Map the library's input errors to one line on stderr and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from kernellab.store import StoreError

        try:
            return fn(*args, **kwargs)
        except (ProblemError, StoreError, UsageFailure) as exc:
            click.echo(f"kernellab: error: {exc}", err=True)
            sys.exit(EXIT_USAGE)

    return wrapper


def emit(obj: Any, as_json: bool, render: Callable[[Any], None]) -> None:
    if as_json:
        click.echo(json.dumps(obj, indent=2, default=str))
    else:
        render(obj)


def _store(db: str, must_exist: bool = True):
    from pathlib import Path

    from kernellab.store import Store

    if must_exist and db != ":memory:" and not Path(db).exists():
        raise UsageFailure(f"{db}: no such database (run a campaign first, or pass --db)")
    return Store(db)


def resume_hint(name: str, db: str) -> str:
    """The command that goes on with campaign ``name``: with the ``--db`` it lives in, unless the default."""
    import shlex

    cmd = f"kernellab resume {name if name == 'NAME' else shlex.quote(name)}"
    return f"`{cmd}`" if db == DEFAULT_DB else f"`{cmd} --db {shlex.quote(db)}`"


DEFAULT_DB = "kernellab.db"
db_option = click.option("--db", default=DEFAULT_DB, show_default=True, metavar="FILE",
                         help="The SQLite store.")
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON on stdout.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kernellab")
def main() -> None:
    """kernellab: agents that write, check, tune and profile GPU kernels for PyTorch models.

    Every speedup it prints was confirmed by its sandbox: correct on fresh inputs, integrity
    checks passed, timed against eager and torch.compile on the same device. On a machine with
    no CUDA device, kernels run in the Triton interpreter on SMALL sizes, and timings are marked
    `interpreted`, never reported as speedups. SIGINT or SIGTERM stops any command within 10 s,
    finished evaluations saved and campaigns marked stopped (resumable); exit code 1.
    """
    from . import _runtime
    from ._interrupt import install

    _runtime.setup()  # the interpreter switch and the ast lock, before any command's work (kernellab._runtime)
    install()  # SIGTERM like Ctrl-C; the stop kills sandbox workers and is bounded by a watchdog


# ------------------------------------------------------------------------------------------------
# inspection of a store
# ------------------------------------------------------------------------------------------------
@main.command()
@click.argument("campaign", required=False)
@db_option
@json_option
@_errors
def status(campaign: str | None, db: str, as_json: bool) -> None:
    """Campaigns in the store, or one CAMPAIGN's summary (best per problem, statuses, LLM cost)."""
    from . import views
    from .campaign import is_stale

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


@main.command()
@click.argument("candidate")
@db_option
@json_option
@click.option("--source/--no-source", default=True, help="Print the candidate's source.")
@_errors
def show(candidate: str, db: str, as_json: bool, source: bool) -> None:
    """One CANDIDATE (id or unique prefix): its action, evaluations, metrics and source."""
    from . import views

    store = _store(db)
    cand = store.get_candidate(candidate)
    if cand is None:
        raise UsageFailure(f"no candidate {candidate!r} in {db} (or the prefix is ambiguous)")
    evals = store.evaluations(candidate_id=cand["id"])
    for e in evals:
        e["metrics"] = store.metrics(e["id"])
    from .problem import declared_mode

    prob = store.get_problem(cand["problem_id"]) or {}
    from .small import recorded_instances

    obj = {"candidate": cand, "evaluations": evals,
           "problem": {"id": cand["problem_id"], "name": prob.get("name"),
                       "mode": declared_mode(prob.get("source") or ""), "instances": recorded_instances(evals)}}
    emit(obj, as_json, lambda o: views.print_candidate(o, source=source))


@main.command()
@click.argument("candidate")
@db_option
@json_option
@_errors
def lineage(candidate: str, db: str, as_json: bool) -> None:
    """The path from the root to CANDIDATE: each step's action and its best evaluation."""
    from . import views
    from .vocab import JUDGED

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


# ------------------------------------------------------------------------------------------------
# evaluation of one file
# ------------------------------------------------------------------------------------------------
@main.command("eval")
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

    from . import views
    from .problem import load_problem

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


# ------------------------------------------------------------------------------------------------
# campaigns, reports, export, benchmark
# ------------------------------------------------------------------------------------------------
# every campaign option's default is CampaignConfig's, so the CLI, bench and kernellab.run agree
_DEFAULT = CampaignConfig(problems=[])


def _campaign_options(fn: Callable) -> Callable:
    d = _DEFAULT
    opts = [
        click.option("--llm", default=d.llm, show_default=True, metavar="BACKEND",
                     help="builtin (offline), anthropic:<model> (ANTHROPIC_API_KEY) or openai:<model> (with --base-url)."),
        click.option("--base-url", default=d.base_url, help="OpenAI-compatible server (vLLM, llama.cpp, Ollama)."),
        click.option("--budget", default=d.budget, show_default=True,
                     help="Candidates per problem (debugger fixes included)."),
        click.option("--time-budget", "time_budget_s", type=float, default=d.time_budget_s, metavar="SECONDS",
                     help="Active wall time for the whole campaign: no round, tuning trial or profile starts after it "
                          "(the evaluations in flight finish)."),
        click.option("--gpu-budget", "gpu_budget_s", type=float, default=d.gpu_budget_s, metavar="SECONDS",
                     help="Summed evaluation time."),
        click.option("--usd-budget", type=float, default=d.usd_budget, metavar="DOLLARS", help="LLM spending limit."),
        click.option("--policy", default=d.policy, show_default=True, help="Search policy: greedy, beam, uct, evolve."),
        click.option("--seed", default=d.seed, show_default=True, help="Seed of the search policy and the tuner."),
        click.option("--trials", default=d.trials, show_default=True, help="Correctness trials per evaluation."),
        click.option("--width", default=d.width, show_default=True, help="Proposals expanded in parallel per round."),
        click.option("--debug-rounds", default=d.debug_rounds, show_default=True,
                     help="Debugger rounds per failing lineage."),
        click.option("--tune-trials", type=int, default=d.tune_trials, metavar="N",
                     help="Optuna trials per candidate with a SPACE; 0: no tuning [default: on a GPU the --budget "
                          f"clamped to {TUNE_TRIALS_MIN}..{TUNE_TRIALS_MAX}; on the CPU 0]."),
        click.option("--objective", type=click.Choice(list(OBJECTIVES)), default=d.objective, show_default=True),
        click.option("--target", type=float, default=d.target, help="Stop a problem once this speedup is reached."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True),
        click.option("--small", is_flag=True, default=d.small, help="SMALL problem sizes (automatic on CPU)."),
        click.option("--inductor-seed/--no-inductor-seed", "inductor_seed", default=d.inductor_seed,
                     help="Builtin agents: also seed from torch.compile's own code [default: on with CUDA, off on CPU]."),
        click.option("--reuse/--no-reuse", default=d.reuse, show_default=True,
                     help="Record an evaluation another campaign in the database made of the same source, on this "
                          "device and software with these settings, instead of evaluating it again."),
        click.option("--replay", default=d.replay, metavar="CAMPAIGN",
                     help="Answer LLM calls from CAMPAIGN's recorded calls (no network)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def _interruptible(fn: Callable[[], dict], store: Any, campaign_id: str, progress: Any = None) -> dict:
    """Run a campaign; a Ctrl-C or an LLM stop (budget spent, service unavailable, replay miss) leaves
    it saved and resumable, and says how to go on (after the live panel is closed, which would
    otherwise draw over the message)."""
    from ._interrupt import exit_now

    try:
        return fn()
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        name = store.get_campaign(campaign_id)["name"]
        click.echo(f"kernellab: interrupted; the campaign is saved: {resume_hint(name, store.path)}", err=True)
        exit_now(EXIT_FAILED)
    except Exception as exc:
        if type(exc).__name__ not in ("BudgetExceeded", "LLMUnavailable", "ReplayMiss", "SandboxUnavailable"):
            raise
        if progress is not None:
            progress.close()
        name = store.get_campaign(campaign_id)["name"]
        click.echo(f"kernellab: stopped: {exc}; the campaign is saved: {resume_hint(name, store.path)}", err=True)
        sys.exit(EXIT_FAILED)


def _finish(summary: dict, as_json: bool, store: Any = None) -> None:
    from . import views
    from .campaign import PROBLEM_FAULT

    emit(summary, as_json, views.print_summary)
    faults = []
    if store is not None:
        # a problem without a correct candidate: say why it stopped (e.g. every candidate timed out)
        won = {b["problem_id"] for b in summary["best"]}
        for e in store.events(summary["campaign"]["id"], "stop"):
            if e["payload"].get("problem_id") not in won:
                reason = str(e["payload"].get("reason"))
                faults.append(PROBLEM_FAULT in reason)
                if not as_json:
                    click.echo(f"{e['payload'].get('problem')}: no correct candidate; stopped: {reason}", err=True)
    # every problem at fault (found in the sandbox, e.g. at full size on a GPU): bad input, as eval says
    bad_input = not summary["best"] and bool(faults) and all(faults)
    sys.exit(EXIT_OK if summary["best"] else EXIT_USAGE if bad_input else EXIT_FAILED)


@main.command()
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
    from .campaign import CampaignConfig, CampaignError, check_campaign, run_campaign, start_campaign
    from .progress import Progress

    config = CampaignConfig(problems=list(problems), device=None if device == "auto" else device, **opts)
    try:
        # checked before the database is opened, so that bad input writes nothing
        checked = check_campaign(config, store=_store(db) if config.replay else None)
    except CampaignError as exc:
        raise UsageFailure(str(exc)) from None
    # the cluster too: one that cannot be reached, or has no worker for the device, writes nothing
    executor = _cluster_executor(cluster, slots=max(1, opts.get("width") or 1), device=config.device)
    try:
        try:
            store = _store(db, must_exist=False)
            cid = start_campaign(store, config, name=name, problems=checked)
        except CampaignError as exc:
            raise UsageFailure(str(exc)) from None
        try:
            with Progress(enabled=None if not as_json else False) as progress:
                if executor is not None:
                    executor.progress = progress
                summary = _interruptible(lambda: run_campaign(store, cid, progress=progress, executor=executor),
                                         store, cid, progress)
        except CampaignError as exc:  # e.g. CampaignBusy: resumed by another process already
            raise UsageFailure(str(exc)) from None
    finally:
        if executor is not None:
            executor.shutdown()
    _finish(summary, as_json, store)


@main.command()
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
    from .campaign import CampaignError, resume_campaign
    from .progress import Progress

    store = _store(db)
    camp = store.get_campaign(campaign)
    if camp is None:
        raise UsageFailure(f"no campaign {campaign!r} in {db}")
    config = camp.get("config") or {}
    # checked before any work, as for run: a cluster that cannot be reached or lacks the device's workers
    executor = _cluster_executor(cluster, slots=max(1, config.get("width") or 1), device=config.get("device"))
    try:
        with Progress(enabled=None if not as_json else False) as progress:
            if executor is not None:
                executor.progress = progress
            summary = _interruptible(lambda: resume_campaign(store, camp["id"], progress=progress, executor=executor,
                                                             usd_budget=usd_budget), store, camp["id"], progress)
    except CampaignError as exc:
        raise UsageFailure(str(exc)) from None
    finally:
        if executor is not None:
            executor.shutdown()
    _finish(summary, as_json, store)


@main.command()
@click.argument("campaign")
@click.option("--problem", default=None, metavar="P", help="Only this problem (name or id).")
@click.option("--force", is_flag=True, help="Re-time winners that were re-timed before, once more.")
@db_option
@json_option
@_errors
def retime(campaign: str, problem: str | None, force: bool, db: str, as_json: bool) -> None:
    """Re-time each problem's winner of CAMPAIGN in a fresh job (candidate, eager and torch.compile
    interleaved): the number status, report, export and bench print. Campaigns do it at their end;
    this does it on demand. Prints the summary; exit 1 when no problem has a correct candidate."""
    from .campaign import CampaignError, campaign_lock, retime_winners

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
            click.echo(f"{o['problem']}: {o['outcome']}")
    _finish(summary, as_json)


@main.command()
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
    from . import report as report_mod

    store = _store(db)
    camp = store.get_campaign(campaign)
    if camp is None:
        raise UsageFailure(f"no campaign {campaign!r} in {db}")
    path = report_mod.write(store, camp["id"], output, objective)
    emit({"campaign": camp["id"], "report": str(path)}, as_json,
         lambda o: click.echo(f"report of {camp['name']} written to {o['report']}"))


@main.command()
@click.argument("campaign")
@click.option("--problem", default=None, metavar="P",
              help="Problem name or id (needed when the campaign has several problems).")
@click.option("-o", "--output", "output", default=None, metavar="FILE",
              help="Where to write the .py file [default: exports/best_<problem>.py].")
@db_option
@json_option
@_errors
def export(campaign: str, problem: str | None, output: str | None, db: str, as_json: bool) -> None:
    """Export the best kernel of a CAMPAIGN as one standalone .py file with its tuned CONFIG,
    loadable with the original model's state_dict. Exit 1 when the problem has no correct candidate."""
    from . import export as export_mod

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


@main.command()
@click.argument("suite")
@_campaign_options
@click.option("--cluster", default=None, metavar="ADDRESS",
              help="Evaluate on a Dask cluster: tcp://HOST:8786 (workers started with `kernellab worker`), or local "
                   "(one worker per local GPU, or local:N CPU workers in the interpreter). Default: this host.")
@click.option("--name", default=None, help="Name in the result files (default: the suite's).")
@click.option("--allow-library", is_flag=True, help="Count library-only and low-share candidates as wins.")
@click.option("--out-dir", type=click.Path(), default=None, help="Where the result files go (default experiments/results).")
@click.option("--jobs", default=1, show_default=True, help="Campaigns run at once (one timing per GPU at a time still).")
@click.option("--shard", default=None, metavar="I/N",
              help="Run only the problems whose rank in the suite sorted by path is I mod N (0 <= I < N).")
@click.option("--summary-only", is_flag=True,
              help="Run nothing: score the suite from the databases given (--db repeated, e.g. one per shard).")
@click.option("--db", "dbs", multiple=True, default=("kernellab.db",), show_default=True, metavar="FILE",
              help="The SQLite store; repeat it with --summary-only to score several databases together.")
@json_option
@_errors
def bench(suite: str, name: str | None, allow_library: bool, out_dir: str | None, jobs: int, shard: str | None,
          summary_only: bool, dbs: tuple[str, ...], as_json: bool, device: str, cluster: str | None = None,
          **opts: Any) -> None:
    """Run a campaign per problem of SUITE (a name in experiments/suites/, a suite file, a folder or
    a glob) and write experiments/results/<date>-<device>-<name>.json and .md: per problem the best
    speedup vs eager and torch.compile (p20-p80), evaluations and time to the best, the winning action
    chain; fast_p and geometric means over the WHOLE suite (unfinished problems count as not correct);
    failures by class; the environment. Incremental: a rerun with the same options into the same
    database skips finished problems and resumes interrupted ones."""
    from pathlib import Path

    from . import views
    from .bench import RESULTS, BenchError, bench_summary, config_kwargs, parse_shard, run_bench
    from .campaign import CampaignError
    from .progress import Progress

    kw = config_kwargs(device=None if device == "auto" else device, **opts)
    out = Path(out_dir) if out_dir else RESULTS
    try:
        shard_t = parse_shard(shard)
        if summary_only:
            if shard_t is not None:
                raise BenchError("--shard runs part of a suite; --summary-only scores the whole suite: give one")
            result, jpath, mpath = bench_summary(suite, [_store(d) for d in dbs], kw, name=name,
                                                 allow_library=allow_library, out_dir=out)
        else:
            if len(dbs) > 1:
                raise BenchError(f"--db given {len(dbs)} times: several databases only with --summary-only")
            store = _store(dbs[0], must_exist=False)
            with Progress(enabled=None if not as_json else False) as progress:
                log = functools.partial(progress.console.print, markup=False, highlight=False, soft_wrap=True)
                factory = (functools.partial(_cluster_executor, cluster, progress, slots=max(1, min(jobs, 4)),
                                             device=kw.get("device"))
                           if cluster else None)
                result, jpath, mpath = run_bench(suite, store, kw, name=name, allow_library=allow_library,
                                                 out_dir=out, progress=progress, jobs=jobs, shard=shard_t, log=log,
                                                 executor_factory=factory)
    except (FileNotFoundError, CampaignError, BenchError) as exc:
        raise UsageFailure(str(exc)) from None
    except KeyboardInterrupt:  # run_bench saved the page and marked its campaigns stopped
        from ._interrupt import exit_now

        click.echo("kernellab: interrupted; finished evaluations are saved, the unfinished campaigns marked stopped: "
                   "the same command resumes them", err=True)
        exit_now(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps({**result, "files": [str(jpath), str(mpath)]}, indent=2, default=str))
    else:
        views.console.print(mpath.read_text(), markup=False, highlight=False, soft_wrap=True)  # the page as written
        views.console.print(f"results: {jpath} and {mpath}")
    sys.exit(EXIT_OK if result["summary"]["correct"] else EXIT_FAILED)


# ------------------------------------------------------------------------------------------------
# studies of strategies: study (run the matrix) and compare (statistics, plots)
# ------------------------------------------------------------------------------------------------
@main.command()
@click.argument("suite")
@_campaign_options
@click.option("--agents", default=None, metavar="A,B",
              help="Agents to compare, comma-separated: builtin, anthropic:<model>, openai:<model> [default: --llm].")
@click.option("--seeds", default=2, show_default=True, help="Seeds per strategy, counting up from --seed.")
@click.option("--name", default=None, help="The study's name [default: <suite>-study]; a rerun grows or resumes it.")
@click.option("--jobs", default=1, show_default=True, help="Campaigns run at once within a cell.")
@click.option("--out-dir", type=click.Path(), default=None,
              help="Where each cell's bench result files go [default: experiments/results/study-<name>].")
@db_option
@json_option
@_errors
def study(suite: str, agents: str | None, seeds: int, name: str | None, jobs: int, out_dir: str | None, db: str,
          as_json: bool, device: str, policy: str, llm: str, seed: int, replay: str | None, **opts: Any) -> None:
    """Run a matrix of search strategies over SUITE into one database: every policy of --policy
    (comma-separated: greedy,beam,uct,evolve) x every --agents x --seeds seeds, one bench campaign
    per problem, each campaign tagged with the study and its cell. Incremental like bench: a rerun
    skips what finished under the same configuration and resumes the rest. Then `kernellab compare
    --study NAME`. Exit 1 while some campaign of the study is unfinished."""
    from pathlib import Path

    from .bench import BenchError, config_kwargs, suite_paths
    from .campaign import CampaignError
    from .progress import Progress
    from .study import StudyError, parse_list, plan_cells, run_study

    if replay:
        raise UsageFailure("--replay is per campaign; a study runs its cells afresh")
    kw = config_kwargs(device=None if device == "auto" else device, **opts)
    try:
        if seeds < 1:
            raise StudyError(f"--seeds must be at least 1, got {seeds}")
        policies, agent_list = parse_list(policy, "--policy"), parse_list(agents or llm, "--agents")
        plan_cells(policies, agent_list, [seed])  # bad input writes nothing, not even the database
        suite_paths(suite)
        store = _store(db, must_exist=False)
        with Progress(enabled=None if not as_json else False) as progress:
            log = functools.partial(progress.console.print, markup=False, highlight=False, soft_wrap=True)
            result = run_study(suite, store, name=name, policies=policies, agents=agent_list,
                               seeds=list(range(seed, seed + seeds)), config_kw=kw, jobs=jobs,
                               out_dir=Path(out_dir) if out_dir else None, progress=progress, log=log)
    except (FileNotFoundError, CampaignError, BenchError, StudyError) as exc:
        raise UsageFailure(str(exc)) from None
    except KeyboardInterrupt:
        from ._interrupt import exit_now

        click.echo("kernellab: interrupted; the same command continues the study where it stopped", err=True)
        exit_now(EXIT_FAILED)

    def render(r: dict) -> None:
        for c in r["cells"]:
            click.echo(f"{c['key']}: {c['finished']}/{c['problems']} problems finished")
        click.echo(f"study {r['study']}: {r['campaigns_finished']}/{r['campaigns_total']} campaigns finished; "
                   f"compare with `kernellab compare --study {r['study']} --db {db} -o {r['study']}.html`")

    emit(result, as_json, render)
    sys.exit(EXIT_OK if result["complete"] else EXIT_FAILED)


@main.command()
@click.argument("campaigns", nargs=-1)
@click.option("--study", "study_name", default=None, metavar="NAME", help="Compare the cells of this study.")
@click.option("--by", type=click.Choice(["strategy", "policy", "agents", "prompts"]), default="strategy",
              show_default=True, help="How runs are grouped (prompts: A/B of prompt and skill content hashes).")
@click.option("--tie", default=0.01, show_default=True, help="Relative difference within which a pair ties.")
@click.option("--bootstrap", "n_boot", default=10_000, show_default=True, help="Bootstrap resamples.")
@click.option("-o", "--output", default=None, metavar="FILE", help="Write the HTML page (plots and tables) here.")
@db_option
@json_option
@_errors
def compare(campaigns: tuple[str, ...], study_name: str | None, by: str, tie: float, n_boot: int,
            output: str | None, db: str, as_json: bool) -> None:
    """Compare search strategies: a study's cells (--study NAME) or CAMPAIGNs. Per strategy: best so
    far against evaluations and GPU-seconds (median and band over problems and seeds), area under
    that curve, evaluations to 95% of the best found, a win/tie/loss matrix with a bootstrap interval
    and a Wilcoxon test, LLM tokens and dollars per unit of gain, failures by class. Interpreted (CPU)
    runs are compared on the interpreter's eager/candidate ratio and claim no speedup."""
    from . import compare as compare_mod

    store = _store(db)
    try:
        result = compare_mod.compare(store, study=study_name, campaigns=campaigns, by=by, tie=tie, n_boot=n_boot)
    except compare_mod.CompareError as exc:
        raise UsageFailure(str(exc)) from None
    if output:
        result["html"] = str(compare_mod.write_html(result, output))
    if as_json:
        click.echo(compare_mod.to_json(result))
    else:
        click.echo(compare_mod.to_text(result))
        if output:
            click.echo(f"page written to {result['html']}")
# optimize: a whole model (kernellab/wholemodel/)
# ------------------------------------------------------------------------------------------------
@main.command()
@click.argument("model")
@click.option("--inputs", default=None, metavar="MODULE:FN",
              help="For package.module:attr, the function returning the example inputs (default: the module's get_inputs).")
@click.option("--budget", default=16, show_default=True, help="Candidates over all subgraphs together.")
@click.option("--time-budget", "time_budget_s", type=float, default=None, metavar="SECONDS",
              help="Wall time over all subgraphs together.")
@click.option("--gpu-budget", "gpu_budget_s", type=float, default=None, metavar="SECONDS",
              help="GPU-seconds (summed evaluation time) over all subgraphs together.")
@click.option("--usd-budget", type=float, default=None, metavar="DOLLARS",
              help="LLM dollars over all subgraphs together.")
@click.option("--per-problem", type=int, default=None, metavar="N",
              help="At most N candidates per subgraph [default: the budget shared by time share, at least 2 each].")
@click.option("--max-heavy", default=4, show_default=True,
              help="A module with at most this many matmul/conv modules is one subgraph; bigger ones are cut.")
@click.option("--min-share", default=0.01, show_default=True,
              help="Subgraphs below this share of the model's time stay PyTorch.")
@click.option("--llm", default="builtin", show_default=True, metavar="BACKEND",
              help="builtin (offline), anthropic:<model> or openai:<model> (with --base-url).")
@click.option("--base-url", default=None, help="OpenAI-compatible server (vLLM, llama.cpp, Ollama).")
@click.option("--trials", default=5, show_default=True, help="Correctness trials per evaluation.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True)
@db_option
@json_option
@_errors
def optimize(model: str, inputs: str | None, budget: int, time_budget_s: float | None, gpu_budget_s: float | None,
             usd_budget: float | None, per_problem: int | None, max_heavy: int, min_share: float, llm: str,
             base_url: str | None, trials: int, device: str, db: str, as_json: bool) -> None:
    """Optimize a whole MODEL: cut it into subgraphs, run a campaign on each, patch the winners back.

    MODEL is a KernelBench-format file (Model, get_inputs, get_init_inputs; SMALL sizes on a CPU) or
    package.module:attr (a module, a module class or a factory; inputs from --inputs or the module's
    get_inputs). The model is profiled on its inputs and cut into subgraphs (modules with at most
    --max-heavy matmul/conv modules; identical blocks, same structure and shapes, are one problem),
    ranked by their share of the model's time. One campaign per problem, most promising first, within
    --budget candidates, --time-budget seconds, --gpu-budget GPU-seconds and --usd-budget LLM dollars in
    all (each campaign gets what those before it left); a rerun with the same --db skips finished
    subgraphs and resumes an interrupted one. The winners are then loaded into this process (their code
    runs unsandboxed here: running this command is that choice) and the patched model is checked end to
    end on fresh inputs in the model's own mode; a subgraph without a correct win (on a GPU: one at least
    1.05x faster than eager) stays PyTorch.
    Prints per subgraph its time share before and after and its winner's lineage, then eager, the
    patched model and torch.compile timed side by side (GPU; on a CPU kernels are interpreted and no
    speedup is claimed). Exit 0 when at least one subgraph runs a kernel and the end-to-end check
    passed, 1 when none does or the check failed, 2 on bad input."""
    from . import wholemodel as opt
    from .campaign import CampaignError
    from .progress import Progress

    dev = None if device == "auto" else device
    try:
        net, xs, name = opt.load_model_spec(model, inputs, device=dev)
        # each campaign's steps as plain lines on stderr, between optimize's own (a live panel would fight them)
        with Progress(enabled=not as_json, plain=True) as progress:
            result = opt.optimize(net, xs, db=db, name=name, budget=budget, time_budget_s=time_budget_s,
                                  gpu_budget_s=gpu_budget_s, usd_budget=usd_budget, per_problem=per_problem,
                                  max_heavy=max_heavy, min_share=min_share, llm=llm, base_url=base_url,
                                  trials=trials, device=dev, progress=progress,
                                  log=None if as_json else lambda s: click.echo(s, err=True))
    except (opt.OptimizeError, CampaignError) as exc:
        raise UsageFailure(str(exc)) from None
    except KeyboardInterrupt:
        from ._interrupt import exit_now

        click.echo(f"kernellab: interrupted; rerun the same command with --db {db} to go on", err=True)
        exit_now(EXIT_FAILED)
    result.pop("model")
    emit(result, as_json, opt.print_result)
    kernels = any(r["patched"] for r in result["problems"])
    ok = kernels and bool((result["check"] or {}).get("ok"))
    sys.exit(EXIT_OK if ok else EXIT_FAILED)


# ------------------------------------------------------------------------------------------------
# scale-out on Dask distributed: `kernellab worker`, and `--cluster` on run and bench
# ------------------------------------------------------------------------------------------------
def _cluster_executor(cluster: str | None, progress: Any = None, slots: int = 1, device: str | None = None) -> Any:
    """The executor ``--cluster`` names (None: none given, the campaign's own local executor), checked to have a
    worker for ``device`` (the campaign's: None = this host's default) before any work."""
    if cluster is None:
        return None
    from kernellab import env
    from kernellab.sandbox import SandboxError

    ex = None
    try:
        from kernellab.sandbox._dask import DaskExecutor

        ex = DaskExecutor(cluster, slots=slots, progress=progress)
        ex.require(device or env.default_device())
        return ex
    except (SandboxError, ImportError) as exc:
        if ex is not None:
            ex.shutdown()
        raise UsageFailure(f"--cluster {cluster}: {exc}") from None


@main.command()
@click.option("--scheduler", required=True, metavar="ADDRESS", help="The Dask scheduler, e.g. tcp://HOST:8786.")
@click.option("--gpu", default=None, metavar="ID",
              help="The GPU this worker owns (pins CUDA_VISIBLE_DEVICES); start one worker per GPU.")
@click.option("--slots", default=1, show_default=True,
              help="Jobs at once on this worker (loading, compiling, checking overlap; timing stays exclusive).")
@click.option("--name", default=None, help="The worker's name in the cluster.")
@_errors
def worker(scheduler: str, gpu: str | None, slots: int, name: str | None) -> None:
    """Run a Dask worker for kernellab campaigns on this host's GPU ID (or the CPU), until stopped.

    Candidates run in kernellab's sandbox processes under it, never in the worker itself. Start the
    scheduler with `dask scheduler`, one `kernellab worker` per GPU, then `kernellab run|bench --cluster`.
    """
    from kernellab.sandbox import SandboxError

    if slots < 1:
        raise UsageFailure(f"--slots must be at least 1, got {slots}")
    if "://" not in scheduler:
        raise UsageFailure(f"--scheduler {scheduler!r}: expected an address like tcp://HOST:8786")
    try:
        from kernellab.sandbox._dask import start_worker

        start_worker(scheduler, gpu=gpu, slots=slots, name=name)
    except (SandboxError, ImportError) as exc:
        raise UsageFailure(str(exc)) from None


if __name__ == "__main__":  # pragma: no cover
    main()
