"""Where a `kernellab run` process spends its seconds before the campaign's first step, part by part, in a fresh
interpreter (the solo run of issue 30 printed its first line 8.8 s after its start on the H200 host).

    python experiments/startup_probe.py [PROBLEM] [--device cuda|cpu]

Prints one JSON line: seconds to import torch, kernellab's CLI, to check the campaign (load the problem), to
name the device and read the versions (what ``start_campaign`` records), and to import the graph and the sandbox.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problem", nargs="?", default=str(ROOT / "tests" / "agents" / "affine_problem.py"))
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    marks = [("start", time.perf_counter())]

    def mark(name: str) -> None:
        marks.append((name, time.perf_counter()))

    import torch  # noqa: F401

    mark("import_torch")
    import kernellab.cli  # noqa: F401

    mark("import_cli")
    from kernellab import env
    from kernellab.campaign import CampaignConfig, check_campaign

    check_campaign(CampaignConfig(problems=[a.problem], budget=4, device=a.device))
    mark("check_campaign")
    env.device_name(a.device)
    mark("device_name")
    env.versions(a.device)
    mark("versions")
    from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401

    import kernellab.agents.graph  # noqa: F401
    import kernellab.sandbox  # noqa: F401

    mark("import_graph_sandbox")
    print(json.dumps({name: round(t - marks[i][1], 3) for i, (name, t) in enumerate(marks[1:])}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
