"""Where the builtin seeds stand against each problem's floor, on the CPU: which kernel work pays next.

    PYTHONPATH=. python experiments/kb_seeds.py [--suite '.kb/level[12]/*.py'] [--db bench.db]
        [--name kb-seeds] [--out-dir experiments/results]

For every problem of ``--suite`` (at its own sizes; nothing runs but the capture): the problem's floor
(``modelled.floor_ms``: its inputs read and outputs written once at the measured bandwidth, or its FLOPs at
the fastest measured rate; "-" where it has none), the builtin seed's modelled H200 time and eager's
(``modelled.modelled_ms``, the cost model: a ranking, never a measurement), and the seed's slowest kernel
group. With ``--db`` (a bench database, gzipped or not) the problems of its finished campaigns are left out.
Sorted by seed over floor, the worst first. Writes ``<date>-cpu-<name>.md`` and ``.json`` under
``--out-dir``; exit 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import gzip
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def finished(db: str) -> set[str]:
    """Names of the problems whose campaign in bench database ``db`` is done."""
    path = db
    with tempfile.TemporaryDirectory() as tmp:
        if db.endswith(".gz"):
            path = str(Path(tmp) / "bench.db")
            with gzip.open(db, "rb") as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = con.execute("SELECT DISTINCT p.name FROM campaigns k JOIN candidates c ON c.campaign_id = k.id "
                               "JOIN problems p ON p.id = c.problem_id WHERE k.status = 'done'").fetchall()
        finally:
            con.close()
    return {r[0] for r in rows}


def survey(path: str) -> dict:
    from kernellab.agents.builtin import modelled
    from kernellab.problem import load_problem

    p = load_problem(path, validate_run=False)
    floor = modelled.floor_ms(p)
    m = modelled.modelled_ms(p)
    slowest = max(m.groups, key=m.groups.get) if m.groups else None
    return {"problem": p.name, "path": path, "floor_ms": floor, "seed_ms": m.ms, "eager_ms": m.eager_ms,
            "seed_over_floor": m.ms / floor if floor else None, "slowest_group": slowest,
            "slowest_ms": m.groups.get(slowest) if slowest else None}


def page(rows: list[dict], args: argparse.Namespace, commit: str, skipped: int) -> str:
    def f(x: float | None, nd: int = 3) -> str:
        return "-" if x is None else f"{x:.{nd}g}"

    out = [f"# Builtin seeds against their floor: `{args.suite}`, {dt.date.today().isoformat()}", "",
           f"kernellab {commit}; the cost model of the reference H200 (a ranking, never a measurement), at each "
           f"problem's own sizes, on the CPU. {len(rows)} problems"
           + (f" ({skipped} finished in `{Path(args.db).name}` left out)." if args.db else "."), "",
           "| problem | floor ms | seed ms | eager ms | seed / floor | slowest group (ms) |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['problem']} | - | - | - | - | {r['error']} |")
            continue
        out.append(f"| {r['problem']} | {f(r['floor_ms'])} | {f(r['seed_ms'])} | {f(r['eager_ms'])} | "
                   f"{f(r['seed_over_floor'], 2)} | {r['slowest_group']} ({f(r['slowest_ms'])}) |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--suite", default=".kb/level[12]/*.py", help="a glob of problem files")
    ap.add_argument("--db", help="a bench database (.db or .db.gz): its finished problems are left out")
    ap.add_argument("--name", default="kb-seeds")
    ap.add_argument("--out-dir", default=str(ROOT / "experiments" / "results"))
    args = ap.parse_args(argv)
    paths = sorted(glob.glob(args.suite))
    if not paths:
        print(f"kb_seeds: no problem file matches {args.suite!r}", file=sys.stderr)
        return 2
    if args.db and not Path(args.db).is_file():
        print(f"kb_seeds: no database {args.db!r}", file=sys.stderr)
        return 2
    done = finished(args.db) if args.db else set()
    rows, skipped = [], 0
    for path in paths:
        if Path(path).stem in done:
            skipped += 1
            continue
        try:
            rows.append(survey(path))
        except Exception as exc:  # one problem the builtin cannot read does not end the survey
            rows.append({"problem": Path(path).stem, "path": path, "error": f"{type(exc).__name__}: {exc}"[:200]})
        print(f"kb_seeds: {len(rows)} of {len(paths) - skipped}", file=sys.stderr, flush=True)
    rows.sort(key=lambda r: -(r.get("seed_over_floor") or 0.0))
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "unknown"
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{dt.date.today().isoformat()}-cpu-{args.name}"
    stem.with_suffix(".md").write_text(page(rows, args, commit, skipped))
    stem.with_suffix(".json").write_text(json.dumps({"suite": args.suite, "db": args.db and Path(args.db).name,
                                                     "commit": commit, "rows": rows}, indent=2) + "\n")
    print(f"kb_seeds: {len(rows)} problems; {stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
