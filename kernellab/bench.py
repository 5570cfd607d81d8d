"""``kernellab bench SUITE``: one campaign per problem of a suite, then one honest table.

fast_p (KernelBench's measure) is the fraction of **all** problems of the suite whose best candidate is
correct and faster than the baseline by more than p; we report it against eager and against
``torch.compile``, both timed in the same run on the same device. A best candidate that runs none of
its own kernels (``library_only``) is not counted as a kernel win unless ``allow_library`` is set.
Interpreted (CPU) runs check correctness only: their speedups are None and fast_p>0 is not computed.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kernellab import env
from kernellab.campaign import CampaignConfig, run_campaign, start_campaign
from kernellab.problem import load_problem

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
THRESHOLDS = (0.0, 1.0, 1.5, 2.0)


def suite_paths(suite: str) -> list[Path]:
    """A suite is a name under experiments/suites/ (``full``), a suite file, or a folder of problems."""
    p = Path(suite)
    candidates = [p, ROOT / "experiments" / "suites" / f"{suite}.txt", ROOT / "experiments" / "suites" / suite]
    for c in candidates:
        if c.is_dir():
            return sorted(x for x in c.rglob("*.py") if not x.name.startswith("_"))
        if c.is_file():
            out = []
            for line in c.read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    q = Path(line)
                    out.append(q if q.is_absolute() else ROOT / q)
            missing = [str(q) for q in out if not q.is_file()]
            if missing:
                raise FileNotFoundError(f"{c}: lists missing problem files: {', '.join(missing)}")
            return out
    raise FileNotFoundError(f"no suite {suite!r} (a name in experiments/suites/, a suite file or a folder)")


def _best_row(store: Any, campaign_id: str, problem_id: str, objective: str, allow_library: bool) -> dict | None:
    evals = []
    for c in store.candidates(campaign_id, problem_id):
        for e in store.evaluations(candidate_id=c["id"]):
            if e["kind"] in ("full", "retime") and e["status"] == "correct" and (allow_library or not e["library_only"]):
                evals.append(e)
    if not evals:
        return None
    return max(evals, key=lambda e: (e[objective] is not None, e[objective] or 0.0, -(e["median_ms"] or 0.0)))


def problem_row(store: Any, campaign_id: str, objective: str = "speedup_eager", allow_library: bool = False) -> dict:
    camp = store.get_campaign(campaign_id)
    pid = camp["config"]["problem_ids"][0]
    prob = store.get_problem(pid)
    full = [e for e in store.evaluations(campaign_id=campaign_id) if e["kind"] == "full"]
    failures: dict[str, int] = {}
    for e in full:
        if e["status"] != "correct":
            key = e["error_class"] or e["status"]
            failures[key] = failures.get(key, 0) + 1
    best = _best_row(store, campaign_id, pid, objective, allow_library)
    row: dict[str, Any] = {"problem": prob["name"], "path": prob["path"], "campaign": camp["name"],
                           "candidates": len(store.candidates(campaign_id, pid)), "evaluations": len(full),
                           "failures": failures, "correct": best is not None}
    any_correct = any(e["status"] == "correct" for e in full)
    row["library_only_correct"] = any_correct and best is None
    if best is None:
        return row
    order = [e["id"] for e in store.evaluations(campaign_id=campaign_id)]
    t0 = _dt.datetime.fromisoformat(camp["created_at"])
    lineage = store.lineage(best["candidate_id"])
    analyses = [ev["payload"] for ev in store.events(campaign_id, "analyze")
                if ev["payload"].get("candidate_id") == best["candidate_id"]]
    row.update({
        "candidate_id": best["candidate_id"], "config": best["config"], "interpreted": bool(best["interpreted"]),
        "median_ms": best["median_ms"], "p20_ms": best["p20_ms"], "p80_ms": best["p80_ms"],
        "eager_ms": best["eager_ms"], "compile_ms": best["compile_ms"],
        "speedup_eager": best["speedup_eager"], "speedup_compile": best["speedup_compile"],
        "speedup_eager_p20_p80": _band(best, "eager_ms"), "speedup_compile_p20_p80": _band(best, "compile_ms"),
        "own_kernel_share": best["own_kernel_share"],
        "evaluations_to_best": order.index(best["id"]) + 1 if best["id"] in order else None,
        "seconds_to_best": round((_dt.datetime.fromisoformat(best["created_at"]) - t0).total_seconds(), 1),
        "actions": [c["action"] or "(seed)" for c in lineage],
        "analysis": analyses[-1] if analyses else None,
    })
    return row


def _band(e: dict, base: str) -> list[float] | None:
    """Speedup at the candidate's p80 and p20 times (a conservative and an optimistic bound)."""
    if e["interpreted"] or not e.get(base) or not e.get("p20_ms") or not e.get("p80_ms"):
        return None
    return [e[base] / e["p80_ms"], e[base] / e["p20_ms"]]


def summarize(rows: list[dict]) -> dict:
    n = len(rows)
    out: dict[str, Any] = {"problems": n, "correct": sum(r["correct"] for r in rows)}
    interpreted = any(r.get("interpreted") for r in rows)
    out["interpreted"] = interpreted
    for base in ("eager", "compile"):
        key = f"speedup_{base}"
        for p in THRESHOLDS:
            name = f"fast_{p:g}_{base}"
            if interpreted and p > 0:
                out[name] = None
                continue
            out[name] = sum(1 for r in rows if r["correct"] and (p == 0 or (r.get(key) or 0) > p)) / n if n else None
        vals = [r[key] for r in rows if r["correct"] and r.get(key)]
        out[f"geomean_{base}_correct"] = math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None
        # counting an incorrect problem as 1.0x (we fall back to the reference) keeps the mean honest
        all_vals = [r.get(key) if r["correct"] and r.get(key) else 1.0 for r in rows]
        out[f"geomean_{base}_all"] = math.exp(sum(map(math.log, all_vals)) / n) if n and not interpreted else None
    fails: dict[str, int] = {}
    for r in rows:
        for k, v in r["failures"].items():
            fails[k] = fails.get(k, 0) + v
    out["failures"] = fails
    return out


def run_bench(suite: str, store: Any, config_kw: dict, name: str | None = None, allow_library: bool = False,
              out_dir: Path = RESULTS, progress: Any = None, jobs: int = 1) -> tuple[dict, Path, Path]:
    """``jobs`` campaigns run at once (threads sharing one sandbox executor): loading, compiling and
    checking overlap while the executor still allows one timing per GPU at a time. The result files are
    rewritten after every finished problem, so an interrupted bench keeps what it measured."""
    from concurrent.futures import ThreadPoolExecutor

    from kernellab import sandbox

    paths = suite_paths(suite)
    problems = [load_problem(p) for p in paths]  # all-or-nothing: a bad file stops before any work
    stamp = _dt.datetime.now(_dt.timezone.utc)
    device = config_kw.get("device") or env.default_device()
    slug = re.sub(r"[^a-z0-9]+", "-", env.device_name(device).lower()).strip("-")[:24]
    stem = f"{stamp.strftime('%Y-%m-%d')}-{slug}-{name or Path(suite).stem}"
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    rows: dict[int, dict] = {}
    result: dict[str, Any] = {}

    def write() -> None:
        ordered = [rows[i] for i in sorted(rows)]
        result.update({"suite": suite, "date": stamp.isoformat(timespec="seconds"), "device": env.device_name(device),
                       "versions": env.versions(), "config": dict(config_kw), "allow_library": allow_library,
                       "problems_total": len(problems), "complete": len(ordered) == len(problems),
                       "summary": summarize(ordered), "problems": ordered})
        jpath.write_text(json.dumps(result, indent=2, default=str))
        mpath.write_text(to_markdown(result))

    # Workers share the GPU's memory evenly; full-size memory-bound problems hold several GB of inputs
    # and reference outputs per trial, so more than 4 workers per GPU run out of memory.
    executor = sandbox.LocalExecutor(workers_per_gpu=max(1, min(jobs, 4)))

    def one(i: int) -> None:
        prob, path = problems[i], paths[i]
        cfg = CampaignConfig(problems=[str(path)], **config_kw)
        cid = start_campaign(store, cfg, name=f"bench-{Path(suite).stem}-{prob.name}-{stamp.strftime('%Y%m%d-%H%M%S')}")
        if progress is not None:
            progress.update(problem=prob.name)
        try:
            run_campaign(store, cid, progress=progress, executor=executor)
        except Exception as exc:  # one broken campaign is a row that says so, not a lost bench
            store.add_event(cid, "error", {"error": f"{type(exc).__name__}: {exc}"[:2000]})
            import traceback

            traceback.print_exc()
        rows[i] = problem_row(store, cid, cfg.objective, allow_library)
        errors = [e["payload"]["error"] for e in store.events(cid, "error")]
        if errors:
            rows[i]["campaign_error"] = errors[-1]
        write()

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for fut in [pool.submit(one, i) for i in range(len(problems))]:
                fut.result()
    finally:
        executor.shutdown()
    write()
    return result, jpath, mpath


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def to_markdown(result: dict) -> str:
    s = result["summary"]
    v = result["versions"]
    lines = [f"# kernellab bench `{result['suite']}` — {result['date']}", "",
             f"Device: {result['device']}; torch {v.get('torch')}, triton {v.get('triton')}, cuda {v.get('cuda')}, "
             f"driver {v.get('driver')}, cupy {v.get('cupy')}, kernellab {v.get('kernellab')} (commit {v.get('commit')}).",
             f"Config: {json.dumps(result['config'], sort_keys=True)}", ""]
    if s["interpreted"]:
        lines += ["**Interpreted run (no CUDA device): correctness only, no speedup is claimed.**", ""]
    total = result.get("problems_total", s["problems"])
    if total != s["problems"]:
        lines += [f"**Incomplete run: {s['problems']} of the suite's {total} problems finished; the fractions "
                  "below are over the finished problems.**", ""]
    lines += ["## Summary", "", f"{s['correct']}/{s['problems']} problems correct.", "",
              "| measure | vs eager | vs torch.compile |", "|---|---|---|"]
    for p in THRESHOLDS:
        a, b = s[f"fast_{p:g}_eager"], s[f"fast_{p:g}_compile"]
        lines.append(f"| fast_{p:g} | {'-' if a is None else f'{a:.2f}'} | {'-' if b is None else f'{b:.2f}'} |")
    lines.append(f"| geomean speedup, correct problems | {_x(s['geomean_eager_correct'])} | {_x(s['geomean_compile_correct'])} |")
    lines.append(f"| geomean speedup, all problems (incorrect = 1.0x) | {_x(s['geomean_eager_all'])} | {_x(s['geomean_compile_all'])} |")
    lines += ["", f"Failures by class (all evaluations): {json.dumps(s['failures'], sort_keys=True) or '{}'}", "",
              "## Problems", "",
              "| problem | correct | best ms (p20–p80) | eager ms | compile ms | vs eager | vs compile | evals to best | s to best | winning actions |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["problems"]:
        if not r["correct"]:
            note = "library-only correct" if r.get("library_only_correct") else "no correct candidate"
            lines.append(f"| {r['problem']} | no ({note}) | - | - | - | - | - | - | - | - |")
            continue
        band = f"{r['median_ms']:.4g} ({r['p20_ms']:.4g}–{r['p80_ms']:.4g})" if r["p20_ms"] else f"{r['median_ms']:.4g}"
        lines.append(f"| {r['problem']} | yes | {band} | {r['eager_ms'] or 0:.4g} | "
                     f"{'-' if r['compile_ms'] is None else format(r['compile_ms'], '.4g')} | {_x(r['speedup_eager'])} | "
                     f"{_x(r['speedup_compile'])} | {r['evaluations_to_best']} | {r['seconds_to_best']} | "
                     f"{' → '.join(r['actions'])} |")
    losers = [r for r in result["problems"] if r["correct"] and r.get("speedup_compile") is not None and r["speedup_compile"] < 1.0]
    if losers:
        lines += ["", "## Where we lose to torch.compile", ""]
        for r in losers:
            a = r.get("analysis") or {}
            lines.append(f"- **{r['problem']}** ({_x(r['speedup_compile'])}): bound {a.get('bound', '?')}, "
                         f"{a.get('pct_of_ceiling') if a.get('pct_of_ceiling') is not None else '?'}% of ceiling. "
                         f"{a.get('evidence', 'no analysis recorded')}")
    return "\n".join(lines) + "\n"


def config_kwargs(**opts: Any) -> dict:
    """Filter CLI options down to CampaignConfig fields (problems excluded)."""
    fields = set(CampaignConfig.__dataclass_fields__) - {"problems"}
    return {k: v for k, v in opts.items() if k in fields}


__all__ = ["run_bench", "suite_paths", "summarize", "to_markdown", "problem_row", "asdict"]
