"""The worker command: scale-out on Dask distributed (`kernellab worker`; `--cluster` on run and bench)."""

from __future__ import annotations

import click

from kernellab.cli._common import (
    UsageFailure,
    _errors,
)


@click.command()
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
