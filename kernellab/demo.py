"""``make demo``: one builtin campaign on a bundled problem, then the result table and the paths of
the database, the HTML report and the exported kernel. On a machine with no CUDA device it runs on
the CPU in the Triton interpreter at the problem's SMALL sizes, and says so."""

from __future__ import annotations

import argparse
import datetime as _dt
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PROBLEM = ROOT / "experiments" / "problems" / "fusions" / "gemm_bias_gelu.py"


def main(argv: list[str] | None = None) -> int:
    from kernellab import _runtime, env
    from kernellab.campaign import CampaignConfig, run_campaign, start_campaign
    from kernellab.progress import Progress
    from kernellab.store import Store
    from kernellab.views import console, print_summary

    ap = argparse.ArgumentParser(prog="python -m kernellab.demo", description=__doc__)
    ap.add_argument("--problem", default=str(DEFAULT_PROBLEM))
    ap.add_argument("--db", default="kernellab.db")
    ap.add_argument("--budget", type=int, default=None, help="candidates (default 6 on CPU, 16 on a GPU)")
    ap.add_argument("--report", default="kernellab-report.html")
    ap.add_argument("--export-dir", default="exports")
    args = ap.parse_args(argv)
    _runtime.setup()  # the interpreter switch and the ast lock, before any work (kernellab._runtime)

    cuda = env.has_cuda()
    if cuda:
        console.print(f"[bold]kernellab demo[/] on {env.device_name('cuda')}")
    else:
        console.print("[bold]kernellab demo[/] on the CPU: no CUDA device here, so kernels run in the Triton "
                      "interpreter at the problem's SMALL sizes. Correctness is real; timings are "
                      "interpreted and no speedup is claimed.")
    budget = args.budget or (16 if cuda else 6)
    config = CampaignConfig(problems=[args.problem], budget=budget, width=3 if not cuda else 4,
                            trials=3 if not cuda else 5, plateau=4)  # tuning: CampaignConfig's default rule
    t0 = time.monotonic()
    store = Store(args.db)
    name = f"demo-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    cid = start_campaign(store, config, name=name)
    with Progress() as progress:
        summary = run_campaign(store, cid, progress=progress)
    print_summary(summary)

    from kernellab import export, report

    report_path = report.write(store, cid, args.report)
    exported = []
    for b in summary["best"]:
        path = Path(args.export_dir) / f"best_{b['problem']}.py"
        exported.append(export.export(store, cid, b["problem_id"], path)[0])
    console.print(f"database: {Path(args.db).resolve()}  (campaign {name}; try `kernellab status {name}`)")
    console.print(f"report:   {Path(report_path).resolve()}")
    for e in exported:
        console.print(f"kernel:   {Path(e).resolve()}")
    console.print(f"demo took {time.monotonic() - t0:.0f} s")
    return 0 if summary["best"] else 1


if __name__ == "__main__":
    sys.exit(main())
