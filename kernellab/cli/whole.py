"""The optimize command: a whole model (kernellab/wholemodel/)."""

from __future__ import annotations

import sys

import click

from kernellab.cli._common import (
    EXIT_FAILED,
    EXIT_OK,
    UsageFailure,
    _errors,
    db_option,
    emit,
    json_option,
)


@click.command()
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
    from kernellab import wholemodel as opt
    from kernellab.campaign import CampaignError
    from kernellab.progress import Progress

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
        from kernellab._interrupt import exit_now

        click.echo(f"kernellab: interrupted; rerun the same command with --db {db} to go on", err=True)
        exit_now(EXIT_FAILED)
    result.pop("model")
    emit(result, as_json, opt.print_result)
    kernels = any(r["patched"] for r in result["problems"])
    ok = kernels and bool((result["check"] or {}).get("ok"))
    sys.exit(EXIT_OK if ok else EXIT_FAILED)
