"""Where a campaign's time went: its steps' seconds summed by step, from the store alone.

    PYTHONPATH=. python experiments/campaign_steps.py CAMPAIGN [--db kernellab.db] [--json]

Every campaign step (plan and the planner's reference profile, code and the Inductor seed's
torch.compile, evaluate with its evaluations' sandbox phases -- the torch.compile baseline among them
--, debug, tune, profile with Nsight Compute, analyze, the winners' re-timing) is a ``step`` event with
its seconds (``kernellab.agents.graph.timed_step``); this sums them (``kernellab.campaign.step_times``).
A step of 10 s or more also printed a progress line while the campaign ran.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernellab.store import Store  # noqa: E402

from kernellab.campaign import CampaignError, format_step_times, step_times  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("campaign", help="campaign name, id or id prefix")
    ap.add_argument("--db", default="kernellab.db")
    ap.add_argument("--json", action="store_true", help="the summary as JSON")
    args = ap.parse_args(argv)
    if not Path(args.db).exists():
        print(f"error: no database {args.db}", file=sys.stderr)
        return 2
    try:
        summary = step_times(Store(args.db), args.campaign)
    except CampaignError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1) if args.json else format_step_times(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
