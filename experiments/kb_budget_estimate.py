"""How long the public suite would take at a larger search budget, from what the budget-4 run has spent.

    PYTHONPATH=. python experiments/kb_budget_estimate.py --db bench.db --pages 'experiments/results/*kb-public-s*-call*.json'
        [--budget 16] [--problems 170] [--call-s 470] [--calls-per-session 3] [--out-dir experiments/results]

An estimate, not a measurement. The database gives the evaluations a finished campaign made, by kind; the
bench call pages (``kernellab bench``'s JSON, their ``pace``) give the evaluations a second of bench wall
bought on that device. A campaign's candidate evaluations (``full``, ``trial``, ``profile``) grow with the
budget; its re-timings (``retime``: the tuner's best trials and the winner's fresh-job re-timing) grow less.
The low end scales only the former, the high end every kind. Writes ``<date>-<device>-kb-budget<B>-estimate``
``.md`` and ``.json`` under ``--out-dir``; exit 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import sqlite3
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kernellab.env import git_commit  # noqa: E402 (the tree, once ROOT is on the path)

RESULTS = ROOT / "experiments" / "results"
GROWS = ("full", "trial", "profile")


def per_campaign(db: str, config_hash: str | None) -> tuple[int, dict[str, float], int | None]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute("SELECT id, config_json FROM campaigns WHERE status = 'done'").fetchall()
    done = [cid for cid, cfg in rows if config_hash is None or config_hash in (cfg or "")]
    if not done:
        raise ValueError(f"{db}: no finished campaign" + (f" under {config_hash}" if config_hash else ""))
    marks = ",".join("?" * len(done))
    counts = dict(con.execute(f"SELECT kind, COUNT(*) FROM evaluations WHERE campaign_id IN ({marks}) GROUP BY kind",
                              done).fetchall())
    budgets = {json.loads(cfg or "{}").get("budget") for cid, cfg in rows if cid in done}
    if len(budgets) > 1:
        raise ValueError(f"{db}: its finished campaigns ran at budgets {sorted(map(str, budgets))}: pass --config-hash")
    return len(done), {k: v / len(done) for k, v in counts.items()}, budgets.pop()


def pace(pages: list[str]) -> dict:
    devices, evals, wall, used = set(), 0, 0.0, []
    for page in pages:
        data = json.loads(Path(page).read_text())
        p = data.get("pace") or {}
        if not p.get("wall_s") or not p.get("evaluations"):
            continue
        devices.add(data.get("device"))
        evals += p["evaluations"]
        wall += p["wall_s"]
        used.append(Path(page).name)
    if not used:
        raise ValueError("no bench page with a pace among --pages")
    if len(devices) != 1:
        raise ValueError(f"the pages come from more than one device: {sorted(map(str, devices))}")
    return {"device": devices.pop(), "evaluations": evals, "wall_s": round(wall, 1),
            "evaluations_per_s": evals / wall, "pages": used}


def estimate(args: argparse.Namespace) -> dict:
    n, kinds, budget = per_campaign(args.db, args.config_hash)
    budget = args.base_budget or budget
    if not budget:
        raise ValueError("the campaigns record no budget: pass --base-budget")
    p = pace(sorted(glob.glob(args.pages)))
    factor = args.budget / budget
    now = sum(kinds.values())
    grows = sum(v for k, v in kinds.items() if k in GROWS)
    low, high = now + grows * (factor - 1), now * factor
    out = {"date": dt.date.today().isoformat(), "commit": git_commit(), "db": Path(args.db).name, "finished_campaigns": n,
           "base_budget": budget, "budget": args.budget, "problems": args.problems,
           "evaluations_per_campaign": {k: round(v, 2) for k, v in sorted(kinds.items())}, "pace": p}
    for tag, per in (("low", low), ("high", high)):
        wall = args.problems * per / p["evaluations_per_s"]
        calls = wall / args.call_s
        out[tag] = {"evaluations_per_problem": round(per, 1), "bench_s": round(wall),
                    "calls": round(calls, 1), "sessions": round(calls / args.calls_per_session, 1)}
    base_wall = args.problems * now / p["evaluations_per_s"]
    out["at_base"] = {"evaluations_per_problem": round(now, 1), "bench_s": round(base_wall),
                      "calls": round(base_wall / args.call_s, 1)}
    return out


def page(r: dict) -> str:
    p, lo, hi = r["pace"], r["low"], r["high"]
    kinds = ", ".join(f"{k} {v}" for k, v in r["evaluations_per_campaign"].items())
    return "\n".join([
        f"# The public suite at budget {r['budget']}: an estimate ({r['date']})", "",
        f"From `{r['db']}` ({r['finished_campaigns']} finished campaigns at budget {r['base_budget']}) and "
        f"{len(p['pages'])} bench call pages on {p['device']} ({p['evaluations']} evaluations in {p['wall_s']} s "
        f"of bench: {p['evaluations_per_s'] * 3600:.0f} an hour). Not a measurement: "
        f"`experiments/kb_budget_estimate.py` at {r['commit'] or 'an unknown commit'}.", "",
        f"Evaluations a finished campaign made, by kind: {kinds}.", "",
        "| | evaluations a problem | bench s for the suite | calls | sessions |",
        "|---|---|---|---|---|",
        f"| budget {r['base_budget']} (as run) | {r['at_base']['evaluations_per_problem']} | "
        f"{r['at_base']['bench_s']} | {r['at_base']['calls']} | - |",
        f"| budget {r['budget']}, re-timings as now (low) | {lo['evaluations_per_problem']} | {lo['bench_s']} | "
        f"{lo['calls']} | {lo['sessions']} |",
        f"| budget {r['budget']}, every kind scaled (high) | {hi['evaluations_per_problem']} | {hi['bench_s']} | "
        f"{hi['calls']} | {hi['sessions']} |", ""])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="the budget-4 bench database (sqlite, not gzipped)")
    ap.add_argument("--pages", required=True, help="glob of the bench call pages' JSON (one device)")
    ap.add_argument("--config-hash", help="only campaigns whose configuration carries this hash")
    ap.add_argument("--base-budget", type=int, help="the database's budget when its campaigns do not record it")
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--problems", type=int, default=170)
    ap.add_argument("--call-s", type=float, default=470.0, help="bench seconds a device call buys")
    ap.add_argument("--calls-per-session", type=float, default=3.0)
    ap.add_argument("--out-dir", default=str(RESULTS))
    args = ap.parse_args(argv)
    try:
        if not Path(args.db).is_file():
            raise ValueError(f"{args.db}: no such database")
        if args.budget < 1 or args.problems < 1 or args.call_s <= 0 or args.calls_per_session <= 0:
            raise ValueError("--budget, --problems, --call-s and --calls-per-session must be positive")
        r = estimate(args)
    except (ValueError, sqlite3.Error, json.JSONDecodeError, OSError) as exc:
        print(f"kb_budget_estimate: {exc}", file=sys.stderr)
        return 2
    stem = f"{r['date']}-{r['pace']['device'].lower().replace(' ', '-')}-kb-budget{r['budget']}-estimate"
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(r, indent=2) + "\n")
    (out / f"{stem}.md").write_text(page(r))
    print(page(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
