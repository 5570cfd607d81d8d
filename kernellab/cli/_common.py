"""What the commands share: exit codes, the error mapping, the store and its options, the campaign
options (CampaignConfig's defaults), the run of a campaign that stops resumably, and --cluster."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

import click

from kernellab.campaign import TUNE_TRIALS_MAX, TUNE_TRIALS_MIN, CampaignConfig
from kernellab.problem import ProblemError
from kernellab.vocab import OBJECTIVES, stops_resumably

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
    from kernellab._interrupt import exit_now

    try:
        return fn()
    except KeyboardInterrupt:
        if progress is not None:
            progress.close()
        name = store.get_campaign(campaign_id)["name"]
        click.echo(f"kernellab: interrupted; the campaign is saved: {resume_hint(name, store.path)}", err=True)
        exit_now(EXIT_FAILED)
    except Exception as exc:
        if not stops_resumably(exc):
            raise
        if progress is not None:
            progress.close()
        name = store.get_campaign(campaign_id)["name"]
        click.echo(f"kernellab: stopped: {exc}; the campaign is saved: {resume_hint(name, store.path)}", err=True)
        sys.exit(EXIT_FAILED)


def _finish(summary: dict, as_json: bool, store: Any = None) -> None:
    from kernellab import views
    from kernellab.campaign import PROBLEM_FAULT

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
