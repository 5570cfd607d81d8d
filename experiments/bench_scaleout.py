"""Scale-out (issue 16): the same bench on one GPU, on every GPU of the host with the local executor, and on a Dask
cluster of one worker per GPU; evaluations per hour, the ratio to one GPU, and whether the results agree.

    python experiments/bench_scaleout.py [--suite starter] [--budget 4] [--jobs 4] [--configs one,local,dask]
    scripts/gpu_check.sh scaleout            # on the GPU host (dask/distributed wheels carried in .whl)

Each configuration is a fresh `kernellab bench` process into its own database (nothing is reused between them),
timed from its start to its end (startup, the cluster's start and every problem's winner re-timing included).
Evaluations are every row the bench wrote (judged, Optuna trials, re-timings); per hour = rows / wall seconds *
3600. "Same results": per problem, the same correct verdict, and the share of the (candidate action, status)
pairs of the judged evaluations the two runs have in common (timing noise can send a greedy search down another
branch, so that share need not be 1). On a machine without a GPU it runs the local executor and a two-worker CPU
cluster in the interpreter (--small), which only shows the script works: interpreted throughput says nothing.
Writes experiments/results/<date>-scaleout-<suite>.json and .md.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def gpus() -> list[str]:
    try:
        import torch

        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        n = 0
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in vis.split(",") if v.strip()] if vis else [str(i) for i in range(n)]
    return ids[:n]


def run_one(label: str, suite: str, args: argparse.Namespace, work: Path, visible: list[str]) -> dict:
    db = work / f"{label}.db"
    cmd = [sys.executable, "-m", "kernellab.cli", "bench", suite, "--budget", str(args.budget), "--jobs", str(args.jobs),
           "--db", str(db), "--out-dir", str(work / f"out-{label}"), "--json", "--name", f"scaleout-{label}"]
    if not visible:
        cmd += ["--device", "cpu", "--small", "--trials", "1"]
    if label == "dask":
        cmd += ["--cluster", "local" if visible else "local:2"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if visible:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
    print(f"== {label}: {' '.join(cmd[3:])} (CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '')})", flush=True)
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.monotonic() - t0
    (work / f"{label}.log").write_text(p.stderr)
    try:
        result = json.loads(p.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"{label}: the bench printed no JSON (exit {p.returncode}); its log ends:\n{p.stderr[-3000:]}") from None
    with sqlite3.connect(db) as c:
        kinds = dict(c.execute("select kind, count(*) from evaluations group by kind").fetchall())
        # the candidate's action, not its source hash: concurrent graph captures can name placeholders differently
        judged = c.execute("select p.name, k.action, e.status from evaluations e join candidates k on "
                           "k.id = e.candidate_id join problems p on p.id = k.problem_id where e.kind = 'full'").fetchall()
        workers = {json.loads(d).get("dask_worker") for (d,) in c.execute("select details_json from evaluations")}
    n = sum(kinds.values())
    out = {"label": label, "gpus": visible, "exit": p.returncode, "wall_s": round(wall, 1), "evaluations": n,
           "by_kind": kinds, "evaluations_per_hour": round(n / wall * 3600, 1) if wall else None,
           "correct": result["summary"]["correct"], "problems": result["problems_total"],
           "fast_1_eager": result["summary"].get("fast_1_eager"),
           "per_problem": {r["problem"]: r["correct"] for r in result["problems"]},
           "judged": {}, "dask_workers": sorted(w for w in workers if w)}
    for name, h, status in judged:
        out["judged"].setdefault(name, []).append([h, status])
    print(f"   {n} evaluations in {wall:.0f} s: {out['evaluations_per_hour']} per hour; {out['correct']}/"
          f"{out['problems']} correct", flush=True)
    return out


def agreement(a: dict, b: dict) -> dict:
    same_verdict = a["per_problem"] == b["per_problem"]
    shares = {}
    for prob in set(a["judged"]) | set(b["judged"]):
        x = {tuple(v) for v in a["judged"].get(prob, [])}
        y = {tuple(v) for v in b["judged"].get(prob, [])}
        shares[prob] = round(len(x & y) / len(x | y), 3) if x | y else 1.0
    return {"same_correct_per_problem": same_verdict, "shared_judged_share": shares}


def markdown(res: dict) -> str:
    lines = [f"# Scale-out: `{res['suite']}` — {res['date']}", "",
             f"Device: {res['device']}; GPUs: {len(res['gpus'])}; budget {res['budget']}, jobs {res['jobs']}; "
             f"commit {res['versions'].get('commit')}.", "",
             "| configuration | GPUs | wall s | evaluations | per hour | ratio to the first | correct |", "|---|---|---|---|---|---|---|"]
    base = res["runs"][0]["evaluations_per_hour"] if res["runs"] else None
    for r in res["runs"]:
        ratio = f"{r['evaluations_per_hour'] / base:.2f}x" if base and r["evaluations_per_hour"] else "-"
        lines.append(f"| {r['label']} | {len(r['gpus']) or 'cpu'} | {r['wall_s']} | {r['evaluations']} | "
                     f"{r['evaluations_per_hour']} | {ratio} | {r['correct']}/{r['problems']} |")
    lines += ["", "Agreement with the first configuration:", ""]
    for label, ag in res["agreement"].items():
        lines.append(f"- {label}: same correct verdict per problem: {ag['same_correct_per_problem']}; shared "
                     f"(candidate action, status) of the judged evaluations: {json.dumps(ag['shared_judged_share'])}")
    if res.get("note"):
        lines += ["", res["note"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default="starter")
    ap.add_argument("--budget", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=4, help="campaigns at once (the same in every configuration)")
    ap.add_argument("--configs", default="one,local,dask", help="one (first GPU), local (all GPUs), dask")
    ap.add_argument("--timeout", type=float, default=3000, help="seconds per configuration")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--work", type=Path, default=None, help="keep the databases and logs here (default: a temporary folder)")
    args = ap.parse_args()
    from kernellab import env

    visible = gpus()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not visible:
        configs = [c for c in configs if c != "one"]  # on the CPU "one GPU" means nothing
    runs = []
    with tempfile.TemporaryDirectory(prefix="kernellab-scaleout-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for label in configs:
            use = visible[:1] if label == "one" else visible
            runs.append(run_one(label, args.suite, args, work, use))
    stamp = dt.datetime.now(dt.timezone.utc)
    res = {"suite": args.suite, "date": stamp.isoformat(timespec="seconds"), "budget": args.budget, "jobs": args.jobs,
           "device": env.device_name() if visible else "cpu (Triton interpreter)", "gpus": visible,
           "versions": env.versions(), "runs": runs,
           "agreement": {r["label"]: agreement(runs[0], r) for r in runs[1:]}}
    if runs and runs[0]["evaluations_per_hour"]:
        res["ratio_to_first"] = {r["label"]: round(r["evaluations_per_hour"] / runs[0]["evaluations_per_hour"], 3)
                                 for r in runs}
    if not visible:
        res["note"] = "Interpreted (no GPU): this shows the script works, not what scale-out gains."
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"{stamp.strftime('%Y-%m-%d')}-scaleout-{Path(args.suite).stem}" + ("" if visible else "-cpu")
    (args.out / f"{stem}.json").write_text(json.dumps(res, indent=2, default=str))
    (args.out / f"{stem}.md").write_text(markdown(res))
    print(markdown(res))
    print(f"results: {args.out / stem}.json and .md")


if __name__ == "__main__":
    main()
