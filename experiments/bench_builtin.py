"""Builtin agents on a problem suite: seeds plus a few planned actions, each judged by the sandbox.

For every problem: evaluate the seed(s) (``seed(problem)``), then expand the best correct one with the
planner's top ``--actions`` proposals (Amdahl-ranked from a torch-profiler profile of the reference),
debugging a failed child once by rule. Everything is timed by ``kernellab.sandbox.evaluate`` (CUDA
events, L2 flushed, eager and torch.compile measured in the same worker). Results accumulate in
``experiments/results/builtin.json`` (a problem already there is skipped unless ``--redo``), so a
long suite can run in several calls; every call rewrites ``experiments/results/builtin.md``.

GPU host (no install needed, the package maps its folders itself):
    PYTHONPATH=. python experiments/bench_builtin.py --suite full --actions 2
CPU smoke run (interpreter, SMALL sizes, correctness only):
    PYTHONPATH=. python experiments/bench_builtin.py --suite ci --small --actions 1 --out /tmp/b
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernellab import env, sandbox  # noqa: E402
from kernellab.agents.builtin import BuiltinAgents, build, built, profile_reference, seed  # noqa: E402
from kernellab.compiler.cost import CEILING_BW, group_costs  # noqa: E402
from kernellab.problem import load_problem  # noqa: E402

ROWRED = {p.strip() for p in (ROOT / "experiments" / "suites" / "gemm_rowred.txt").read_text().splitlines()
          if p.strip() and not p.startswith("#")}


def suite(name: str) -> list[str]:
    f = Path(name) if Path(name).is_file() else ROOT / "experiments" / "suites" / f"{name}.txt"
    out = []
    for line in f.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def _row(code, res: dict, cid: str, parent: str | None = None) -> dict:
    return {"id": cid, "parent_id": parent, "source": code.source, "meta": code.meta, "selected": True,
            "best": res, "analysis": None}


def evaluate(problem, code, args) -> dict:
    t0 = time.perf_counter()
    try:
        r = sandbox.evaluate(problem, code.source, small=args.small, device=args.device, trials=args.trials,
                             timing=not args.small)
    except Exception as exc:  # a sandbox fault is a result too
        r = {"status": "crash", "error_text": f"{type(exc).__name__}: {exc}"}
    r["wall_s"] = round(time.perf_counter() - t0, 1)
    r["action"] = code.action
    r["kernels"] = code.meta.get("kernels")
    r["actions"] = code.meta.get("actions")
    return r


def bench_problem(path: str, args) -> dict:
    problem = load_problem(ROOT / path)
    agents = BuiltinAgents()
    tried: list[dict] = []
    rows: list[dict] = []
    for i, code in enumerate(seed(problem)):
        r = evaluate(problem, code, args)
        tried.append(r)
        rows.append(_row(code, r, f"s{i}"))
    ref = {}
    if not args.small:
        try:
            ref = profile_reference(problem, device=args.device)
        except Exception as exc:
            ref = {"error": str(exc)}
    for step in range(args.actions):
        good = [x for x in rows if x["best"].get("status") == "correct"]
        if not good:
            break
        parent = max(good, key=lambda x: x["best"].get("speedup_eager") or 0.0)
        tree = [dict(x, selected=x is parent) for x in rows]
        props = agents.plan(problem, tree, 1, ref)
        if not props:
            break
        code = agents.code(problem, props[0], parent)
        r = evaluate(problem, code, args)
        r["expected_gain"] = props[0].expected_gain
        tried.append(r)
        rows.append(_row(code, r, f"a{step}", parent["id"]))
        if r.get("status") != "correct":
            fix = agents.debug(problem, rows[-1], r)
            if fix.source:
                fixed = build(problem, fix.meta["actions"])
                r2 = evaluate(problem, fixed, args)
                r2["debug_of"] = code.action
                tried.append(r2)
                rows.append(_row(fixed, r2, f"d{step}", rows[-1]["id"]))
    correct = [r for r in tried if r.get("status") == "correct"]
    with_kernel = [r for r in correct if (r.get("kernels") or 0) > 0 and not r.get("library_only")]
    pool = with_kernel or correct
    best = min(pool, key=lambda r: r.get("median_ms") or math.inf) if pool else None
    out: dict[str, Any] = {"problem": path, "tried": tried, "best": best}
    if best and best.get("median_ms") and not args.small:
        b = built(problem, best.get("actions") or [])
        costs = group_costs(b.graph, b.groups)
        nbytes, flops = sum(c.bytes for c in costs), sum(c.flops for c in costs)
        out["bytes"], out["flops"] = nbytes, flops
        out["bw_pct"] = 100.0 * nbytes / (best["median_ms"] / 1e3) / CEILING_BW
        out["memory_bound"] = flops / max(nbytes, 1.0) < 20.0  # below ~20 FLOP/byte nothing is compute-bound
        if ref.get("ops"):
            out["reference_top_ops"] = ref["ops"][:3]
    return out


def _geo(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def _f(x: Any, fmt: str = "{:.3f}") -> str:
    return "—" if x is None else fmt.format(x)


def write_markdown(results: dict, path: Path, meta: dict) -> None:
    rows = [results[k] for k in sorted(results)]
    lines = ["# Builtin agents: seed + planned actions, judged by the sandbox", "",
             f"- date: {meta['date']}", f"- device: {meta['device']}", f"- versions: {json.dumps(meta['versions'])}",
             f"- git commit: {meta['commit']}", f"- command: `{meta['command']}`", "",
             "Speedups are eager/candidate and compile/candidate medians from the same worker (CUDA events, L2 "
             "flushed). `best` = fastest correct candidate that runs at least one generated kernel (else the "
             "fastest correct one). `BW %` = counted bytes of the fused groups over the median time, against "
             "the 4.22 TB/s copy ceiling (memory-bound problems only).", "",
             "| problem | best action | kernels | status | ms | eager ms | compile ms | x eager | x compile | own share | BW % | tried |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    sp_e, sp_c, rowred, bw = [], [], [], []
    n_ok = n_kernel = 0
    for r in rows:
        b = r.get("best") or {}
        ok = b.get("status") == "correct"
        n_ok += ok
        has_k = ok and (b.get("kernels") or 0) > 0 and not b.get("library_only")
        n_kernel += has_k
        se, sc = b.get("speedup_eager"), b.get("speedup_compile")
        if ok:
            sp_e.append(se)
            sp_c.append(sc)
        if r["problem"] in ROWRED:
            rowred.append((r["problem"], sc))
        if r.get("memory_bound") and ok:
            bw.append((r["problem"], r.get("bw_pct")))
        statuses = ",".join(t.get("status", "?")[:7] for t in r.get("tried", []))
        lines.append(f"| {Path(r['problem']).stem} | {b.get('action', '—')} | {b.get('kernels', '—')} | "
                     f"{b.get('status', 'none')} | {_f(b.get('median_ms'))} | {_f(b.get('eager_ms'))} | "
                     f"{_f(b.get('compile_ms'))} | {_f(se, '{:.2f}')} | {_f(sc, '{:.2f}')} | "
                     f"{_f(b.get('own_kernel_share'), '{:.2f}')} | "
                     f"{_f(r.get('bw_pct'), '{:.0f}') if r.get('memory_bound') else '—'} | {statuses} |")
    ge, gc = _geo(sp_e), _geo(sp_c)
    lines += ["", "## Summary against the issue's goals", "",
              f"- correct: {n_ok}/{len(rows)}; correct and running a generated Triton kernel: {n_kernel}/{len(rows)} (goal: all)",
              f"- geometric-mean speedup over eager: {_f(ge, '{:.2f}')} (goal >= 1.3); over torch.compile: "
              f"{_f(gc, '{:.2f}')} (goal >= 1.0)",
              "- GEMM + row reduction over torch.compile (goal > 1.0 each): "
              + (", ".join(f"{Path(p).stem} {_f(s, '{:.2f}')}" for p, s in rowred) or "—"),
              "- memory-bound problems at >= 80% of copy bandwidth: "
              + (f"{sum(1 for _, x in bw if x and x >= 80)}/{len(bw)} ("
                 + ", ".join(f"{Path(p).stem} {_f(x, '{:.0f}')}%" for p, x in bw) + ")" if bw else "—"),
              ""]
    path.write_text("\n".join(lines) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", default="full")
    ap.add_argument("--actions", type=int, default=2, help="planned actions per problem after the seeds")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="SMALL sizes (CPU interpreter: correctness only)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--only", default="", help="comma-separated problem name filter")
    ap.add_argument("--redo", action="store_true", help="re-run problems already in the JSON")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "builtin"))
    args = ap.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    jpath = out.with_suffix(".json")
    results = json.loads(jpath.read_text()) if jpath.exists() else {}
    paths = suite(args.suite)
    if args.only:
        keep = set(args.only.split(","))
        paths = [p for p in paths if Path(p).stem in keep]
    for path in paths:
        if path in results and not args.redo:
            continue
        t0 = time.perf_counter()
        try:
            results[path] = bench_problem(path, args)
        except Exception as exc:
            results[path] = {"problem": path, "tried": [], "best": None,
                             "error": "".join(traceback.format_exception_only(type(exc), exc)).strip()}
        b = results[path].get("best") or {}
        print(f"{Path(path).stem:32s} {b.get('status', 'none'):10s} x_eager={_f(b.get('speedup_eager'), '{:.2f}')} "
              f"x_compile={_f(b.get('speedup_compile'), '{:.2f}')} {b.get('action', results[path].get('error', ''))} "
              f"({time.perf_counter() - t0:.0f}s)", flush=True)
        jpath.write_text(json.dumps(results, indent=1, default=str))
    meta = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "device": env.device_name(args.device), "versions": env.versions(), "commit": env.git_commit(),
            "command": " ".join(["python"] + sys.argv)}
    write_markdown(results, out.with_suffix(".md"), meta)
    print(f"wrote {out.with_suffix('.md')} and {jpath}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
