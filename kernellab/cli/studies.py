"""Commands over suites: bench (a suite's campaigns), study (the strategy matrix) and compare (statistics, plots)."""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import click

from kernellab.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageFailure,
    _campaign_options,
    _cluster_executor,
    _errors,
    _store,
    db_option,
    emit,
    json_option,
)


@click.command()
@click.argument("suite")
@_campaign_options
@click.option("--cluster", default=None, metavar="ADDRESS",
              help="Evaluate on a Dask cluster: tcp://HOST:8786 (workers started with `kernellab worker`), or local "
                   "(one worker per local GPU, or local:N CPU workers in the interpreter). Default: this host.")
@click.option("--name", default=None, help="Name in the result files (default: the suite's).")
@click.option("--allow-library", is_flag=True, help="Count library-only and low-share candidates as wins.")
@click.option("--out-dir", type=click.Path(), default=None, help="Where the result files go (default experiments/results).")
@click.option("--jobs", default=1, show_default=True, help="Campaigns run at once (one timing per GPU at a time still); at most a quarter of them "
              "(at least one) on problems whose jobs each ask for more than a quarter of the GPU's memory.")
@click.option("--shard", default=None, metavar="I/N",
              help="Run only the problems whose rank in the suite sorted by path is I mod N (0 <= I < N).")
@click.option("--rerun", multiple=True, metavar="PROBLEM",
              help="Run PROBLEM (a name or file stem of the suite) again under the current code although it finished, "
                   "once: a stopped rerun resumes, a finished one counts instead of the earlier campaign. Repeatable.")
@click.option("--summary-only", is_flag=True,
              help="Run nothing: score the suite from the databases given (--db repeated, e.g. one per shard).")
@click.option("--db", "dbs", multiple=True, default=("kernellab.db",), show_default=True, metavar="FILE",
              help="The SQLite store; repeat it with --summary-only to score several databases together.")
@json_option
@_errors
def bench(suite: str, name: str | None, allow_library: bool, out_dir: str | None, jobs: int, shard: str | None,
          rerun: tuple[str, ...], summary_only: bool, dbs: tuple[str, ...], as_json: bool, device: str,
          cluster: str | None = None, **opts: Any) -> None:
    """Run a campaign per problem of SUITE and score the whole suite: fast_p against eager and
    torch.compile, incremental (a rerun skips finished problems).

    SUITE is a name in experiments/suites/, a suite file, a folder, a glob or one problem file. Writes
    experiments/results/<date>-<device>-<name>.json and .md: per problem the best kernel win (at least half
    its GPU time in its own kernels) with its speedup vs eager and torch.compile (p20-p80), evaluations and
    time to the best, the winning action chain; fast_p and geometric means over the WHOLE suite (unfinished
    problems count as not correct); failures by class; the environment. Incremental: a rerun with the same
    options into the same database skips finished problems (or only re-times their winners, where that is
    missing) and resumes interrupted ones."""
    from pathlib import Path

    from kernellab import views
    from kernellab.bench import RESULTS, BenchError, bench_summary, config_kwargs, parse_shard, run_bench
    from kernellab.campaign import CampaignError
    from kernellab.progress import Progress

    kw = config_kwargs(device=None if device == "auto" else device, **opts)
    out = Path(out_dir) if out_dir else RESULTS
    try:
        shard_t = parse_shard(shard)
        if summary_only:
            if shard_t is not None or rerun:
                raise BenchError(f"{'--shard' if shard_t is not None else '--rerun'} runs problems; --summary-only "
                                 "runs nothing: give one")
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
                                                 executor_factory=factory, rerun=rerun)
    except (FileNotFoundError, CampaignError, BenchError) as exc:
        raise UsageFailure(str(exc)) from None
    except KeyboardInterrupt:  # run_bench saved the page and marked its campaigns stopped
        from kernellab._interrupt import exit_now

        click.echo("kernellab: interrupted; finished evaluations are saved, the unfinished campaigns marked stopped: "
                   "the same command resumes them", err=True)
        exit_now(EXIT_FAILED)
    if as_json:
        click.echo(json.dumps({**result, "files": [str(jpath), str(mpath)]}, indent=2, default=str))
    else:
        views.console.print(mpath.read_text(), markup=False, highlight=False, soft_wrap=True)  # the page as written
        views.console.print(f"results: {jpath} and {mpath}")
    sys.exit(EXIT_OK if result["summary"]["correct"] else EXIT_FAILED)



@click.command()
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
    """Run a matrix of search strategies (policy x agents x seed) over SUITE into one database,
    incremental like bench.

    Every policy of --policy (comma-separated: greedy,beam,uct,evolve) x every --agents x --seeds
    seeds, one bench campaign per problem, each campaign tagged with the study and its cell. A rerun
    skips what finished under the same configuration and resumes the rest. Then `kernellab compare
    --study NAME`. Exit 1 while some campaign of the study is unfinished."""
    from pathlib import Path

    from kernellab.bench import BenchError, config_kwargs, suite_paths
    from kernellab.campaign import CampaignError
    from kernellab.progress import Progress
    from kernellab.study import StudyError, parse_list, plan_cells, run_study

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
        from kernellab._interrupt import exit_now

        click.echo("kernellab: interrupted; the same command continues the study where it stopped", err=True)
        exit_now(EXIT_FAILED)

    def render(r: dict) -> None:
        for c in r["cells"]:
            click.echo(f"{c['key']}: {c['finished']}/{c['problems']} problems finished")
        click.echo(f"study {r['study']}: {r['campaigns_finished']}/{r['campaigns_total']} campaigns finished; "
                   f"compare with `kernellab compare --study {r['study']} --db {db} -o {r['study']}.html`")

    emit(result, as_json, render)
    sys.exit(EXIT_OK if result["complete"] else EXIT_FAILED)


@click.command()
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
    """Compare search strategies, a study's cells (--study NAME) or CAMPAIGNs, with statistics (and an
    HTML page with -o).

    Per strategy: best so far against evaluations and GPU-seconds (median and band over problems and
    seeds), area under that curve, evaluations to 95% of the best found, a win/tie/loss matrix with a
    bootstrap interval and a Wilcoxon test, LLM tokens and dollars per unit of gain, failures by class.
    Interpreted (CPU) runs are compared on the interpreter's eager/candidate ratio and claim no speedup.
    The page (-o) holds the plots as inline SVG (matplotlib) and opens offline."""
    from kernellab import compare as compare_mod

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
