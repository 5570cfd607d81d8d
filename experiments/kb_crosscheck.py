"""Cross-check a bench database against KernelBench's own harness.

    PYTHONPATH=. python experiments/kb_crosscheck.py --db bench.db [--kernelbench ../shared/kernelbench]
        [--config-hash H] [--problem NAME]... [--trials 5] [--perf-trials 100] [--out-dir experiments/results]

For every problem of the database (per problem the latest finished campaign; ``--config-hash`` keeps the
bench campaigns of one configuration, see ``kernellab bench``), the winner is exported exactly as
``kernellab export`` writes it -- and, where it is another candidate (a library-only one is fastest), the
best own-kernel candidate too, the bench's "correct own-kernel winner" -- and each is judged by
KernelBench's ``eval_kernel_against_ref`` (5 correctness trials, cuda-event timing of the candidate and of
the reference, the same defaults as KernelBench's own scripts; backend "triton": the file is imported from a
temp file, which ``@triton.jit`` needs). Each KernelBench run is a child process, so a crash or a CUDA fault
costs one row. Writes ``<date>-<device>-kb-crosscheck.md`` and ``.json``: per problem both harnesses'
verdicts and speedups side by side, and the agreement counts; device, versions, kernellab commit,
KernelBench's commit and the date.

KernelBench's eval is CUDA-only: without a CUDA device the script stops with one line (exit 2).
Known differences it may show: KernelBench casts every input tensor to the precision (integer
indices and boolean masks included; kernellab keeps their dtype), and a campaign run at SMALL sizes
is judged here at the problem's full sizes (the row says so).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# ../shared/kernelbench beside the checkout, or KERNELBENCH_DIR (a GPU host gets a copy carried in the tree)
DEFAULT_KB = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


class CrosscheckError(Exception):
    """Bad input: printed as one line, exit 2."""


# -- reading the database (pure: no GPU, no KernelBench) ---------------------------------------------------
def _const(source: str, name: str) -> Any:
    """A module-level constant of the problem (``DTYPE``, ``ATOL``...), read without executing the file."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def winners(store: Any, config_hash: str | None = None, problems: list[str] | None = None) -> list[dict]:
    """One row per problem: its latest finished campaign's winner (``store.best``, what ``export``
    exports) with kernellab's verdict and the exported source (None when nothing is correct)."""
    from kernellab import export

    latest: dict[str, dict] = {}
    for camp in store.list_campaigns():
        cfg = camp.get("config") or {}
        if camp["status"] != "done":
            continue
        if config_hash is not None and ((cfg.get("bench") or {}).get("config_hash") != config_hash):
            continue
        for pid in cfg.get("problem_ids") or []:
            if pid not in latest or (camp["updated_at"] or "") >= (latest[pid]["updated_at"] or ""):
                latest[pid] = camp
    rows = []
    for pid, camp in latest.items():
        prob = store.get_problem(pid)
        if problems and prob["name"] not in problems and pid not in problems:
            continue
        best = store.best(camp["id"], pid)
        small = camp["config"].get("small")
        base: dict[str, Any] = {
            "problem": prob["name"], "problem_id": pid, "path": prob["path"], "campaign": camp["name"],
            "campaign_id": camp["id"], "device": camp["device"], "dtype": _const(prob["source"], "DTYPE") or "float32",
            "own_tolerance": any(_const(prob["source"], k) is not None for k in ("ATOL", "RTOL")),
            "small": bool(small) if small is not None else camp["device"].startswith("cpu"),
            "reference": prob["source"], "source": None, "kernelbench": None, "winner": "exported"}
        if not best:
            rows.append({**base, "kernellab": {"correct": False, "status": "no correct candidate"}})
            continue
        # the exported winner (fastest correct, a library-only one too) and, where it is another candidate, the
        # best own-kernel one: the bench's "correct own-kernel winner" is that one, so it is judged too
        own = store.best(camp["id"], pid, library=False)
        picks = [(best[0], True, "exported")]
        if own and (own[0]["candidate_id"], own[0]["config_json"]) != (best[0]["candidate_id"], best[0]["config_json"]):
            picks.append((own[0], False, "own-kernel"))
        for e, library, which in picks:
            row = {**base, "winner": which}
            row["kernellab"] = {
                "correct": True, "status": "correct", "candidate_id": e["candidate_id"], "evaluation_id": e["id"],
                "interpreted": bool(e["interpreted"]), "median_ms": e["median_ms"], "eager_ms": e["eager_ms"],
                "speedup_eager": None if e["interpreted"] else e["speedup_eager"],
                "speedup_compile": None if e["interpreted"] else e["speedup_compile"],
                "own_kernel_share": e["own_kernel_share"], "library_only": bool(e["library_only"])}
            row["source"] = export.export_source(store, camp["id"], pid, library=library)
            rows.append(row)
    if problems:
        missing = sorted(set(problems) - {r["problem"] for r in rows} - {r["problem_id"] for r in rows})
        if missing:
            raise CrosscheckError(f"no finished campaign for problem(s) {', '.join(missing)} in {store.path}")
    return sorted(rows, key=lambda r: (r["problem"], r["winner"] != "exported"))


# -- the comparison (pure) ------------------------------------------------------------------------------------
def compare(rows: list[dict]) -> dict:
    """Fills each row's ``agreement`` and returns the counts. A row whose KernelBench verdict is
    missing (no winner to export, or the run failed before a verdict) is counted apart."""
    counts = {"problems": len(rows), "both_correct": 0, "both_not_correct": 0, "kernellab_only_correct": 0,
              "kernelbench_only_correct": 0, "no_winner": 0, "kernelbench_no_verdict": 0,
              "speedup_compared": 0, "speedup_same_side_of_1x": 0, "speedup_within_10pct": 0}
    for r in rows:
        kl, kb = r["kernellab"], r.get("kernelbench")
        if r.get("source") is None:
            r["agreement"] = "no winner"
            counts["no_winner"] += 1
            continue
        if kb is None or kb.get("correctness") is None:
            r["agreement"] = "no KernelBench verdict"
            counts["kernelbench_no_verdict"] += 1
            continue
        key = {(True, True): "both_correct", (False, False): "both_not_correct",
               (True, False): "kernellab_only_correct", (False, True): "kernelbench_only_correct"}[
            (bool(kl["correct"]), bool(kb["correctness"]))]
        counts[key] += 1
        r["agreement"] = key.replace("_", " ")
        a, b = kl.get("speedup_eager"), kb.get("speedup")
        if key == "both_correct" and a and b:
            counts["speedup_compared"] += 1
            counts["speedup_same_side_of_1x"] += (a > 1.0) == (b > 1.0)
            counts["speedup_within_10pct"] += abs(b / a - 1.0) <= 0.10
    judged = sum(counts[k] for k in ("both_correct", "both_not_correct", "kernellab_only_correct",
                                     "kernelbench_only_correct"))
    counts["verdicts_compared"] = judged
    counts["verdicts_agree"] = counts["both_correct"] + counts["both_not_correct"]
    return counts


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def to_markdown(result: dict) -> str:
    env, c = result["environment"], result["agreement"]
    v = env["versions"]
    lines = [f"# KernelBench cross-check of `{result['db']}` — {env['date']}", "",
             f"Device: {env['device']}; torch {v.get('torch')}, triton {v.get('triton')}, cuda {v.get('cuda')}, "
             f"kernellab {v.get('kernellab')} (commit {v.get('commit')}); KernelBench {env['kernelbench_commit']} "
             f"at `{env['kernelbench']}`.",
             f"KernelBench settings: {json.dumps(result['settings'], sort_keys=True)}", "",
             f"**Verdicts agree on {c['verdicts_agree']} of {c['verdicts_compared']} winners** "
             f"(both correct {c['both_correct']}, both not correct {c['both_not_correct']}, kernellab only "
             f"{c['kernellab_only_correct']}, KernelBench only {c['kernelbench_only_correct']}); "
             f"{c['no_winner']} problems without a correct kernellab candidate, {c['kernelbench_no_verdict']} "
             "without a KernelBench verdict.",
             f"Speedups (both correct, both timed: {c['speedup_compared']}): on the same side of 1.0x "
             f"{c['speedup_same_side_of_1x']}, within 10% {c['speedup_within_10pct']}. kernellab's speedup is "
             "eager median / candidate median (interleaved, L2 flushed); KernelBench's is its reference mean / "
             "candidate mean over its timing trials, the reference timed after the candidate.",
             _cost_line(result["problems"]), "",
             "| problem | kernellab | KernelBench | kernellab vs eager | KernelBench vs reference | agreement | note |",
             "|---|---|---|---|---|---|---|"]
    for r in result["problems"]:
        kl, kb = r["kernellab"], r.get("kernelbench") or {}
        kb_verdict = "-" if not kb else ("correct" if kb.get("correctness") else
                                         "not compiled" if kb.get("compiled") is False else
                                         "no verdict" if kb.get("correctness") is None else "incorrect")
        notes = []
        if r.get("small"):
            notes.append("kernellab ran SMALL sizes")
        if r.get("own_tolerance"):
            notes.append("problem sets ATOL/RTOL; KernelBench uses its own")
        if kl.get("library_only"):
            notes.append("library-only winner")
        if r.get("winner") == "own-kernel":
            notes.append("the best own-kernel candidate (the exported winner is the row above)")
        if kb.get("excessive_speedup"):
            notes.append("KernelBench flags excessive speedup")
        if kb.get("error"):
            notes.append(kb["error"][:100].replace("|", "/").replace("\n", " "))
        lines.append(f"| {r['problem']} | {kl['status']} | {kb_verdict} | {_x(kl.get('speedup_eager'))} | "
                     f"{_x(kb.get('speedup'))} | {r.get('agreement', '-')} | {'; '.join(notes)} |")
    return "\n".join(lines) + "\n"


def _cost_line(rows: list[dict]) -> str:
    """How many KernelBench runs this cross-check made and their wall time (a verdict kept from an earlier
    cross-check cost nothing here): what judging the rest of a suite will cost in device time."""
    ran = [kb["seconds"] for r in rows if (kb := r.get("kernelbench") or {}).get("seconds") is not None
           and "kept_from" not in kb]
    kept = sum(1 for r in rows if "kept_from" in (r.get("kernelbench") or {}))
    return (f"KernelBench ran {len(ran)} times here, {sum(ran):.0f} s in all"
            + (f" (mean {sum(ran) / len(ran):.1f} s)" if ran else "") + f"; {kept} verdicts kept from earlier.")


# -- running KernelBench (a child process per problem) --------------------------------------------------------
def import_kernelbench(kb: Path) -> Any:
    """KernelBench's ``eval`` module. Its package imports dotenv, litellm and openai for its LLM
    helpers, which the eval path never calls: stubs stand in for them."""
    for name, attrs in {"dotenv": ["load_dotenv"], "litellm": ["completion"], "openai": ["OpenAI"]}.items():
        if name not in sys.modules:
            mod = types.ModuleType(name)
            for a in attrs:
                setattr(mod, a, lambda *args, **kw: None)
            sys.modules[name] = mod
    sys.path.insert(0, str(kb / "src"))
    from kernelbench import eval as kb_eval

    return kb_eval


def _child(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    kb_eval = import_kernelbench(Path(job["kernelbench"]))
    precision = kb_eval.get_torch_dtype_from_string(job["precision"])
    out: dict[str, Any] = {}
    try:
        res = None
        for _ in range(2):  # None = KernelBench's "lock file error, please retry"
            res = kb_eval.eval_kernel_against_ref(
                original_model_src=job["reference"], custom_model_src=job["source"],
                num_correct_trials=job["trials"], num_perf_trials=job["perf_trials"], measure_performance=True,
                timing_method=job["timing_method"], backend="triton", precision=precision,
                build_dir=job["build_dir"], check_for_excessive_speedup=True, excessive_speedup_threshold=10)
            if res is not None:
                break
        if res is None:
            out = {"compiled": None, "correctness": None, "error": "KernelBench returned no result (lock file error twice)"}
        else:
            md = res.metadata or {}
            errs = [f"{k}: {md[k]}" for k in sorted(md) if "error" in k and md[k]]
            out = {"compiled": res.compiled, "correctness": res.correctness,
                   "runtime": res.runtime if res.runtime and res.runtime > 0 else None,
                   "ref_runtime": res.ref_runtime if res.ref_runtime and res.ref_runtime > 0 else None,
                   "excessive_speedup": bool(md.get("excessive_speedup")), "hardware": md.get("hardware"),
                   "error": "; ".join(errs)[:2000] or None}
            if out["runtime"] and out["ref_runtime"]:
                out["speedup"] = out["ref_runtime"] / out["runtime"]
    except Exception as exc:  # an exception of the harness itself, not a verdict
        out = {"compiled": None, "correctness": None, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    Path(job["out"]).write_text(json.dumps(out, default=str))


def run_kernelbench(row: dict, kb: Path, trials: int, perf_trials: int, timing_method: str, timeout_s: float) -> dict:
    """KernelBench's verdict on ``row``'s source, from a child process, with ``seconds``: the run's wall time
    (what the cross-check of a whole suite costs in device time, run by run)."""
    t0 = time.monotonic()
    out = _run_kernelbench(row, kb, trials, perf_trials, timing_method, timeout_s)
    return {**out, "seconds": round(time.monotonic() - t0, 1)}


def _run_kernelbench(row: dict, kb: Path, trials: int, perf_trials: int, timing_method: str, timeout_s: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="kb-crosscheck-") as tmp:
        job = {"kernelbench": str(kb), "reference": row["reference"], "source": row["source"],
               "precision": PRECISIONS.get(row["dtype"], "fp32"), "trials": trials, "perf_trials": perf_trials,
               "timing_method": timing_method, "build_dir": str(Path(tmp) / "build"), "out": str(Path(tmp) / "out.json")}
        Path(tmp, "job.json").write_text(json.dumps(job))
        try:
            p = subprocess.run([sys.executable, __file__, "--_child", str(Path(tmp, "job.json"))], capture_output=True,
                               text=True, timeout=timeout_s, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"compiled": None, "correctness": None, "error": f"KernelBench run timed out after {timeout_s:.0f} s"}
        out = Path(job["out"])
        if not out.exists():
            tail = (p.stderr or p.stdout or "").strip().splitlines()[-3:]
            return {"compiled": None, "correctness": None,
                    "error": f"KernelBench's process ended with code {p.returncode}: {' / '.join(tail)}"[:2000]}
        return json.loads(out.read_text())


def _kb_commit(kb: Path) -> str:
    """KernelBench's own checkout's commit, else the one its README names. A copy inside another repository
    (the .kb carried to the GPU host) is not a checkout: git would answer with the outer repository's HEAD
    (the H200 cross-check of session 10 named kernellab's commit as KernelBench's)."""
    try:
        def git(*args: str) -> str:
            return subprocess.run(["git", "-C", str(kb), *args], capture_output=True, text=True,
                                  check=True).stdout.strip()

        if Path(git("rev-parse", "--show-toplevel")).resolve() == kb.resolve():
            return git("rev-parse", "--short", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pass
    m = re.search(r"commit ([0-9a-f]{7,40})", (kb / "README.md").read_text()) if (kb / "README.md").exists() else None
    return m.group(1) if m else "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", help="the bench database (kernellab.db of `kernellab bench`)")
    ap.add_argument("--kernelbench", default=str(DEFAULT_KB), help="KernelBench's folder [$KERNELBENCH_DIR or ../shared/kernelbench]")
    ap.add_argument("--config-hash", default=None, help="only the bench campaigns of this configuration hash")
    ap.add_argument("--problem", action="append", default=None, help="only this problem (name or id; repeatable)")
    ap.add_argument("--trials", type=int, default=5, help="KernelBench correctness trials [5]")
    ap.add_argument("--perf-trials", type=int, default=100, help="KernelBench timing trials [100]")
    ap.add_argument("--timing-method", default="cuda_event")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per KernelBench run [900]")
    ap.add_argument("--out-dir", default=str(ROOT / "experiments" / "results"))
    ap.add_argument("--keep", default=None, metavar="JSON",
                    help="an earlier cross-check's JSON: its KernelBench verdicts of the same evaluations are kept, not "
                         "run again (a suite cross-checked as its bench grows, call by call)")
    ap.add_argument("--_child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        _child(args._child)
        return 0
    try:
        return _main(args)
    except CrosscheckError as exc:
        print(f"kb_crosscheck: error: {exc}", file=sys.stderr)
        return 2


def _judged(row: dict) -> tuple | None:
    """What a KernelBench verdict is of: the problem, which winner, and kernellab's evaluation of it."""
    kl = row.get("kernellab") or {}
    return (row["problem_id"], row.get("winner", "exported"), kl["evaluation_id"]) if kl.get("evaluation_id") else None


def kept_verdicts(path: Path) -> dict[tuple, dict]:
    """An earlier cross-check's KernelBench verdicts by :func:`_judged` (failed runs left out: run again)."""
    if not path.is_file():
        raise CrosscheckError(f"--keep {path}: no such file")
    try:
        rows = json.loads(path.read_text())["problems"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CrosscheckError(f"--keep {path}: not a kb_crosscheck JSON ({exc})") from None
    return {key: r["kernelbench"] for r in rows if (key := _judged(r)) is not None
            and (r.get("kernelbench") or {}).get("correctness") is not None}


def _main(args: argparse.Namespace) -> int:
    from kernellab import env
    from kernellab.fileio import write_atomic
    from kernellab.store import Store

    if not args.db:
        raise CrosscheckError("--db is required (a database written by `kernellab bench`)")
    if not Path(args.db).is_file():
        raise CrosscheckError(f"{args.db}: no such database")
    kb = Path(args.kernelbench).resolve()  # the KernelBench children run in temporary directories
    if not (kb / "src" / "kernelbench" / "eval.py").is_file():
        raise CrosscheckError(f"{kb}: not a KernelBench folder (no src/kernelbench/eval.py); pass --kernelbench")
    if not env.has_cuda():
        raise CrosscheckError("KernelBench's eval_kernel_against_ref needs a CUDA device and none is visible")
    rows = winners(Store(args.db), args.config_hash, args.problem)
    if not rows:
        raise CrosscheckError(f"{args.db}: no finished campaign" + (f" with config hash {args.config_hash}"
                                                                    if args.config_hash else ""))
    kept = kept_verdicts(Path(args.keep)) if args.keep else {}
    interrupted = False
    for k, r in enumerate(rows, 1):
        known = kept.get(_judged(r))
        if known is not None:
            r["kernelbench"] = {**known, "kept_from": args.keep}
        elif r["source"] is not None and not interrupted:
            try:
                r["kernelbench"] = run_kernelbench(r, kb, args.trials, args.perf_trials, args.timing_method,
                                                   args.timeout)
            except KeyboardInterrupt:  # a device call's time is up: the verdicts so far are written, the rest kept
                interrupted = True
        if interrupted:
            r.setdefault("kernelbench", {"correctness": None, "error": "not run: interrupted"})
            continue
        kbv = r["kernelbench"] or {}
        took = f" ({kbv['seconds']:.0f} s)" if kbv.get("seconds") is not None and "kept_from" not in kbv else ""
        print(f"kb_crosscheck: {k}/{len(rows)} {r['problem']}: kernellab {r['kernellab']['status']}, "
              f"KernelBench {kbv.get('correctness', '-')}{took}", file=sys.stderr)
    counts = compare(rows)
    stamp = dt.datetime.now(dt.timezone.utc)
    device = env.device_name("cuda")
    result = {"db": args.db, "settings": {"num_correct_trials": args.trials, "num_perf_trials": args.perf_trials,
                                          "timing_method": args.timing_method, "backend": "triton",
                                          "config_hash": args.config_hash},
              "environment": {"date": stamp.isoformat(timespec="seconds"), "device": device, "versions": env.versions(),
                              "kernelbench": str(kb), "kernelbench_commit": _kb_commit(kb)},
              "agreement": counts,
              "problems": [{k: v for k, v in r.items() if k not in ("reference", "source")} for r in rows]}
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")[:24]
    stem = Path(args.out_dir) / f"{stamp.strftime('%Y-%m-%d')}-{slug}-kb-crosscheck"
    write_atomic(stem.with_suffix(".json"), json.dumps(result, indent=2, default=str))
    write_atomic(stem.with_suffix(".md"), to_markdown(result))
    if interrupted:
        print("kb_crosscheck: interrupted; the unjudged winners are marked 'not run' (pass this JSON as --keep)",
              file=sys.stderr)
    print(f"kb_crosscheck: verdicts agree on {counts['verdicts_agree']} of {counts['verdicts_compared']}; "
          f"{stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
