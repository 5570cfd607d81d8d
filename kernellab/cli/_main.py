"""The command group: ``kernellab`` and its commands, one module per group of them."""

from __future__ import annotations

import click

from kernellab.cli import campaigns, inspection, studies, whole, worker


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
    from kernellab import _runtime
    from kernellab._interrupt import install

    _runtime.setup()  # the interpreter switch and the ast lock, before any command's work (kernellab._runtime)
    install()  # SIGTERM like Ctrl-C; the stop kills sandbox workers and is bounded by a watchdog


# the order a reader meets them in (README.md's command table follows it; `kernellab --help` sorts by name)
for _cmd in (campaigns.run, campaigns.resume, inspection.status, campaigns.retime, inspection.show, inspection.lineage,
             inspection.eval_, campaigns.report, campaigns.export, studies.bench, studies.study, studies.compare,
             whole.optimize, worker.worker):
    main.add_command(_cmd)
