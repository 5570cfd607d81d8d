"""What the builtin agents would do with every KernelBench level-1/2 problem, without a GPU and
without a campaign.

    PYTHONPATH=. python experiments/kb_coverage.py [--kernelbench DIR] [--level 1 --level 2]
        [--problem NAME]... [--sample 12] [--timeout 120] [--out-dir experiments/results]

For each problem file: derive its small instance (``kernellab.small``: the file's ``SMALL`` or the
shrunk size constants; deriving it runs the reference once on the CPU), capture its graph
(``kernellab/compiler/capture.py``: torch.export on the meta device at full and small size), partition
and generate the seed (``build``). Per problem the row says whether it was captured (and why not),
which ops became our own Triton kernels, which ATen ops stay with PyTorch (cuDNN, cuBLAS, ATen:
"library"), whether a seed source came out, and one line for whatever is unsupported. Outcomes:

- ``own``       every compute op runs in generated kernels (views and reshapes between them do not count);
- ``mixed``     generated kernels and library ops side by side (e.g. cuDNN conv + our fused epilogue);
- ``library``   captured, but no op became a kernel of ours: the seed is PyTorch only;
- ``no-capture`` neither torch.export nor make_fx captured the model;
- ``error``     the builtin raised after capture (partition or codegen): a bug, with its traceback's last line;
- ``no-load``   the file itself does not load.

``--sample N`` then evaluates the seed of N problems spread over the outcome classes in the real
sandbox (``kernellab.sandbox.evaluate``, Triton interpreter, small size, correctness only), so that
"a seed was produced" can be read as "a correct seed" or not.

Writes ``<date>-kb-coverage.md`` and ``.json`` under ``--out-dir``: the table, counts by outcome, and
the library / unsupported ops ranked by how many problems they keep from being all-own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import signal
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_KB = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
OUTCOMES = ("own", "mixed", "library", "no-capture", "error", "no-load")
# ATen ops that only move metadata or copy: PyTorch runs them between kernels; they are not compute
# that an own kernel should have taken over, so they do not make a problem "mixed"
_GLUE = {"clone.default", "contiguous.default", "_to_copy.default", "copy.default", "alias.default",
         "lift_fresh_copy.default", "detach.default"}


class CoverageError(Exception):
    """Bad input: printed as one line, exit 2."""


class _Timeout(Exception):
    pass


def _alarm(_sig, _frame):
    raise _Timeout()


def problem_files(kb: Path, levels: list[int], names: list[str] | None = None) -> list[Path]:
    """The level files (sorted by their KernelBench number), or those named by ``names`` (a stem, a
    file name or a path)."""
    if names:
        out = []
        for n in names:
            p = Path(n)
            if p.is_file():
                out.append(p)
                continue
            hits = [f for lv in levels for f in (kb / f"level{lv}").glob("*.py") if f.stem == n or f.name == n]
            if not hits:
                raise CoverageError(f"problem {n!r}: not found under {kb} levels {levels}")
            out += hits
        return out
    out = []
    for lv in levels:
        d = kb / f"level{lv}"
        if not d.is_dir():
            raise CoverageError(f"{d}: no such directory (set KERNELBENCH_DIR or --kernelbench)")
        files = [f for f in d.glob("*.py") if f.stem.split("_", 1)[0].isdigit()]
        out += sorted(files, key=lambda f: int(f.stem.split("_", 1)[0]))
    return out


def _last_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _where(exc: BaseException) -> str:
    """file:line of the innermost frame inside the builtin (or kernellab), for a bug report."""
    frames = traceback.extract_tb(exc.__traceback__)
    for fr in reversed(frames):
        if "/kernellab/compiler/" in fr.filename or "/kernellab/" in fr.filename:
            rel = fr.filename.split(str(ROOT) + "/", 1)[-1]
            return f"{rel}:{fr.lineno} ({fr.name})"
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"


def analyse(path: Path, level: int | None = None) -> dict[str, Any]:
    """One problem's row (see the module docstring). Never raises for a problem's sake."""
    from kernellab.agents.builtin.build import build, built
    from kernellab.compiler.capture import CaptureError
    from kernellab.problem import ProblemError, load_problem
    from kernellab.small import small_overrides

    row: dict[str, Any] = {"problem": path.stem, "level": level, "file": str(path), "outcome": None,
                           "captured": False, "capture_method": None, "small": None, "small_error": None,
                           "kernels": 0, "kernel_groups": [], "own_ops": [], "library_ops": [],
                           "seed": False, "seed_chars": 0, "second_seed": None, "reason": "", "bug": None}
    t0 = time.perf_counter()
    try:
        problem = load_problem(path, validate_run=False)
    except (ProblemError, Exception) as exc:  # noqa: BLE001 - the file itself is the problem
        row.update(outcome="no-load", reason=_last_line(exc))
        return row
    try:
        row["small"] = small_overrides(problem)
    except ProblemError as exc:
        row["small_error"] = str(exc).removeprefix(f"{problem.label}: ")[:300]
    except Exception as exc:  # noqa: BLE001
        row["small_error"] = _last_line(exc)
    stage = "capture"
    try:
        b = built(problem)
        row.update(captured=True, capture_method=b.graph.method)
        stage = "codegen"
        code = build(problem)
        row.update(seed=True, seed_chars=len(code.source), kernels=int(code.meta.get("kernels", 0)))
        stage = "second seed"
        from kernellab.agents.builtin.agents import seed as seeds
        extra = seeds(problem)[1:]
        if extra:
            row["second_seed"] = extra[0].action
    except CaptureError as exc:
        row.update(outcome="no-capture", reason=_capture_reason(str(exc)))
        row["elapsed_s"] = round(time.perf_counter() - t0, 2)
        return row
    except _Timeout:
        raise
    except Exception as exc:  # noqa: BLE001 - a builtin bug is a finding, not a crash of the survey
        row.update(outcome="error", reason=f"{stage} raised {_last_line(exc)}",
                   bug={"stage": stage, "where": _where(exc), "last_line": _last_line(exc)})
        if not row["captured"]:
            row["outcome"] = "no-capture" if stage == "capture" else "error"
        row["elapsed_s"] = round(time.perf_counter() - t0, 2)
        return row

    g = b.graph
    own: list[str] = []
    lib: list[str] = []
    groups = []
    for grp in b.groups:
        if grp.kind == "torch":
            for name in grp.nodes:
                n = g.node(name)
                if n.kind == "opaque" and n.op not in _GLUE:
                    # an integer or boolean op (a mask built with arange, a batch counter) is not the
                    # float compute the kernels are for: say so in its label
                    odd = n.dtype and not _floating(g, n)
                    lib.append(f"{n.op} [{n.dtype}]" if odd else n.op)
            continue
        ops = [g.node(n).op for n in grp.nodes]
        own += ops
        groups.append(grp.describe(g))
    row["kernel_groups"] = groups
    row["own_ops"] = sorted(set(own))
    row["library_ops"] = sorted(set(lib))
    row["glue_ops"] = sorted({g.node(n).op for grp in b.groups if grp.kind == "torch" for n in grp.nodes
                              if g.node(n).kind == "opaque" and g.node(n).op in _GLUE})
    if row["kernels"] and not lib:
        row["outcome"] = "own"
    elif row["kernels"]:
        row["outcome"] = "mixed"
        row["reason"] = "no Triton lowering for " + ", ".join(_short(o) for o in row["library_ops"])
    else:
        row["outcome"] = "library"
        row["reason"] = ("no Triton lowering for " + ", ".join(_short(o) for o in row["library_ops"])
                         if lib else "no compute op captured (views only)")
    notes = [n for n in g.notes if "SMALL capture failed" in n]
    if notes:  # the seed then bakes full-size constants: wrong at the small size, maybe right at full size
        row["note"] = notes[0][:300]
    row["elapsed_s"] = round(time.perf_counter() - t0, 2)
    return row


def _floating(g, n) -> bool:
    """The node computes on floating data: its result or one of the values it reads is floating."""
    fl = ("float32", "float16", "bfloat16", "float64")
    return n.dtype in fl or any(g.node(r).dtype in fl for r in n.refs() if r in g.by_name)


def _short(op: str) -> str:
    return op.replace(".default", "")


def _capture_reason(text: str) -> str:
    """One line from a CaptureError that joins every attempt's error: the export error on meta
    (the first tried, usually the telling one), then how many other attempts failed."""
    parts = [p.strip() for p in text.split("; ") if p.strip()]
    if not parts:
        return "capture failed"
    first = parts[0]
    return (first[:240] + (f" (+{len(parts) - 1} other attempts failed)" if len(parts) > 1 else ""))


# -- the correctness sample --------------------------------------------------------------------------

def pick_sample(rows: list[dict], n: int) -> list[dict]:
    """About ``n`` rows with a seed, spread over the outcome classes and, within each, over the
    kinds of kernel (pointwise, rows, gemm, special); only rows with a small instance (the
    interpreter needs one). ``n < 0``: all of them."""
    cands = [r for r in rows if r.get("seed") and r.get("small") is not None]
    if n < 0:
        return cands

    def kind(r: dict) -> str:
        kinds = sorted({gd.split(": ", 1)[1].split(" ")[0] for gd in r["kernel_groups"]})
        return f"{r['outcome']}:{'+'.join(kinds) or '-'}"

    # outcome -> kernel-kind bucket -> rows; round-robin over the outcomes, and within an outcome
    # over its buckets, so that a few seeds of each class are judged before a second of any kind
    by_outcome: dict[str, dict[str, list[dict]]] = {}
    # a hash of the name orders each bucket: deterministic, and spread over both levels
    for r in sorted(cands, key=lambda r: hashlib.sha1(r["problem"].encode()).hexdigest()):
        by_outcome.setdefault(r["outcome"], {}).setdefault(kind(r), []).append(r)
    order = [o for o in OUTCOMES if o in by_outcome]
    turns = {o: 0 for o in order}
    out: list[dict] = []
    while len(out) < n and order:
        for o in list(order):
            if len(out) >= n:
                break
            buckets = [b for b in by_outcome[o].values() if b]
            # a library-only seed is PyTorch's own code: a couple of them show the harness, no more
            if not buckets or (o == "library" and turns[o] >= max(1, n // 6)):
                order.remove(o)
                continue
            out.append(buckets[turns[o] % len(buckets)].pop(0))
            turns[o] += 1
    return out


def evaluate_seed(path: Path, trials: int) -> dict[str, Any]:
    """The builtin seed judged by the real sandbox on the CPU (interpreter, small size)."""
    from kernellab import sandbox
    from kernellab.agents.builtin.build import build
    from kernellab.problem import load_problem

    problem = load_problem(path, validate_run=False)
    code = build(problem)
    t0 = time.perf_counter()
    res = sandbox.evaluate(problem, code.source, small=True, device="cpu", trials=trials, timing=False)
    err = (res.get("error_text") or "").strip()
    return {"status": res.get("status"), "error_class": res.get("error_class"),
            "error": (err.splitlines()[-1] if err else "")[:300], "max_abs_err": res.get("max_abs_err"),
            "eval_s": round(time.perf_counter() - t0, 1)}


# -- the report -----------------------------------------------------------------------------------

def summarise(rows: list[dict]) -> dict[str, Any]:
    counts = Counter(r["outcome"] for r in rows)
    blocking: Counter = Counter()
    for r in rows:
        for op in r.get("library_ops") or []:
            blocking[op] += 1
    reasons = Counter(r["reason"] for r in rows if r["outcome"] in ("no-capture", "error", "no-load"))
    n = len(rows)
    with_kernel = counts["own"] + counts["mixed"]
    checked = [r for r in rows if r.get("cpu_check")]
    check = {o: dict(Counter(r["cpu_check"].get("status") for r in checked if r["outcome"] == o))
             for o in OUTCOMES if any(r["outcome"] == o for r in checked)}
    correct_own = sum(1 for r in checked if r["outcome"] in ("own", "mixed")
                      and r["cpu_check"].get("status") == "correct")
    return {"problems": n, "by_outcome": {k: counts.get(k, 0) for k in OUTCOMES},
            "seed_produced": sum(1 for r in rows if r.get("seed")),
            "with_own_kernel": with_kernel, "with_own_kernel_share": round(with_kernel / n, 3) if n else 0.0,
            "all_own_share": round(counts["own"] / n, 3) if n else 0.0,
            "no_small_instance": sum(1 for r in rows if r.get("small") is None),
            "cpu_checked": len(checked), "cpu_check_by_outcome": check,
            "correct_with_own_kernel": correct_own,
            "cpu_check_failures": [{"problem": r["problem"], "outcome": r["outcome"], **r["cpu_check"]}
                                   for r in checked if r["cpu_check"].get("status") != "correct"],
            "library_ops_ranked": [[op, k] for op, k in blocking.most_common()],
            "failure_reasons": [[why, k] for why, k in reasons.most_common()],
            "bugs": [{"problem": r["problem"], **r["bug"]} for r in rows if r.get("bug")]}


def _cell(x: Any, width: int = 90) -> str:
    s = str(x).replace("|", "\\|").replace("\n", " ")
    return s if len(s) <= width else s[: width - 1] + "…"


def markdown(rows: list[dict], summary: dict, sample: list[dict], meta: dict) -> str:
    L = [f"# KernelBench coverage of the builtin agents ({meta['date']})", "",
         f"kernellab {meta['commit']}, torch {meta['torch']}, KernelBench at `{meta['kernelbench']}`, "
         f"levels {meta['levels']}. No GPU, no campaign: capture -> partition -> codegen of the seed only "
         "(`experiments/kb_coverage.py`). The seed as the CPU builds it: on a GPU an fp32 conv's reference is cuDNN in "
         "TF32, and there the seed calls cuDNN for the conv with our kernel as its epilogue (the planner's children run "
         "our conv; `codegen.CONV_ON_TF32_REFERENCE`).", "",
         "## Summary", "",
         f"- problems: **{summary['problems']}**; a seed source produced for **{summary['seed_produced']}**",
         f"- with at least one own Triton kernel (own + mixed): **{summary['with_own_kernel']}** "
         f"({summary['with_own_kernel_share']:.0%}); every compute op in own kernels: "
         f"**{summary['by_outcome']['own']}** ({summary['all_own_share']:.0%})",
         f"- no small instance (cannot be checked on the CPU interpreter): {summary['no_small_instance']}", "",
         "| outcome | problems |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in summary["by_outcome"].items()]
    L += ["", "### Ops left to PyTorch / the library, by problems they keep from being all-own", "",
          "| op | problems |", "|---|---|"]
    L += [f"| `{_short(op)}` | {k} |" for op, k in summary["library_ops_ranked"]]
    if summary["failure_reasons"]:
        L += ["", "### Why the rest has no seed", "", "| reason | problems |", "|---|---|"]
        L += [f"| {_cell(why, 160)} | {k} |" for why, k in summary["failure_reasons"]]
    if summary["bugs"]:
        L += ["", "### Builtin bugs found (the builtin raised after capture)", "",
              "| problem | stage | where | last line |", "|---|---|---|---|"]
        L += [f"| {b['problem']} | {b['stage']} | `{b['where']}` | {_cell(b['last_line'], 160)} |"
              for b in summary["bugs"]]
    if sample:
        ok = sum(1 for s in sample if s["eval"].get("status") == "correct")
        L += ["", f"## Seeds judged by the sandbox (CPU, Triton interpreter, small size): {ok}/{len(sample)} correct",
              "", f"- correct seeds with at least one own kernel (own + mixed): **{summary['correct_with_own_kernel']}**"
              f" of {summary['problems']} problems", "", "| outcome | statuses |", "|---|---|"]
        L += [f"| {o} | {', '.join(f'{k}: {v}' for k, v in sorted(c.items(), key=lambda kv: str(kv[0])))} |"
              for o, c in summary["cpu_check_by_outcome"].items()]
        # a long run lists only what failed; a short sample lists every seed
        shown = sample if len(sample) <= 20 else [s for s in sample if s["eval"].get("status") != "correct"]
        L += ["", "| problem | outcome | kernels | status | error / max abs err | s |", "|---|---|---|---|---|---|"]
        for s in shown:
            e = s["eval"]
            L.append(f"| {s['problem']} | {s['outcome']} | {s['kernels']} | {e.get('status')} | "
                     f"{_cell(e.get('error') or e.get('max_abs_err') or '', 120)} | {e.get('eval_s', '')} |")
    if meta.get("findings"):  # read off the run by hand (kept in the JSON, so --render keeps them)
        L += ["", "## Findings", ""] + [f"- {f}" for f in meta["findings"]]
    L += ["", "## Per problem", "",
          "| level | problem | outcome | kernels | own ops | library ops | seed | CPU check | reason |",
          "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        own = ", ".join(_short(o) for o in r.get("own_ops") or [])
        lib = ", ".join(_short(o) for o in r.get("library_ops") or [])
        seed = "yes" + (" (+ cuBLAS variant)" if r.get("second_seed") else "") if r.get("seed") else "no"
        why = "; ".join(x for x in (r.get("reason"), r.get("note")) if x)
        L.append(f"| {r.get('level') or ''} | {r['problem']} | {r['outcome']} | {r.get('kernels', 0)} | "
                 f"{_cell(own, 70)} | {_cell(lib, 60)} | {seed} | {(r.get('cpu_check') or {}).get('status', '')} | "
                 f"{_cell(why, 200)} |")
    return "\n".join(L) + "\n"


def _commit() -> str:
    import subprocess
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def run(kb: Path, levels: list[int], names: list[str] | None, out_dir: Path, sample_n: int, timeout: int,
        trials: int, stem: str | None = None, log=print) -> dict[str, Any]:
    import torch

    files = problem_files(kb, levels, names)
    out_dir.mkdir(parents=True, exist_ok=True)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    stem = stem or f"{date}-kb-coverage"
    partial = out_dir / f"{stem}.partial.json"
    done: dict[str, dict] = {}
    if partial.exists():  # resume an interrupted survey: rows of the same file content are kept
        for r in json.loads(partial.read_text()):
            done[r["file"]] = r
    rows: list[dict] = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        for i, f in enumerate(files):
            level = next((lv for lv in levels if f.parent.name == f"level{lv}"), None)
            if str(f) in done:
                rows.append(done[str(f)])
                continue
            signal.alarm(timeout)
            try:
                row = analyse(f, level)
            except _Timeout:
                row = {"problem": f.stem, "level": level, "file": str(f), "outcome": "error", "captured": False,
                       "kernels": 0, "seed": False, "reason": f"timed out after {timeout}s (capture or codegen)",
                       "bug": {"stage": "timeout", "where": "?", "last_line": f"no answer in {timeout}s"}}
            finally:
                signal.alarm(0)
            rows.append(row)
            log(f"[{i + 1}/{len(files)}] {f.stem}: {row['outcome']} kernels={row.get('kernels', 0)} "
                f"{row.get('reason') or ''}"[:200])
            partial.write_text(json.dumps(rows, indent=1, default=str))
    finally:
        signal.signal(signal.SIGALRM, old)
    sample: list[dict] = []
    for r in pick_sample(rows, sample_n):
        try:
            ev = evaluate_seed(Path(r["file"]), trials)
        except Exception as exc:  # noqa: BLE001
            ev = {"status": "harness-error", "error": _last_line(exc)}
        r["cpu_check"] = ev
        sample.append({"problem": r["problem"], "outcome": r["outcome"], "kernels": r["kernels"], "eval": ev})
        log(f"sample {r['problem']} ({r['outcome']}): {ev.get('status')} {ev.get('error') or ''}"[:200])
    summary = summarise(rows)
    meta = {"date": date, "commit": _commit(), "torch": torch.__version__, "kernelbench": str(kb),
            "levels": levels}
    doc = {"meta": meta, "summary": summary, "sample": sample, "problems": rows}
    (out_dir / f"{stem}.json").write_text(json.dumps(doc, indent=1, default=str))
    (out_dir / f"{stem}.md").write_text(markdown(rows, summary, sample, meta))
    if partial.exists():
        partial.unlink()
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernelbench", type=Path, default=DEFAULT_KB)
    ap.add_argument("--level", type=int, action="append", help="KernelBench level (repeatable; default 1 and 2)")
    ap.add_argument("--problem", action="append", help="only this problem (stem, file name or path; repeatable)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--stem", help="output file stem (default <date>-kb-coverage)")
    ap.add_argument("--sample", default="0", help="evaluate this many seeds in the CPU sandbox ('all': every "
                    "seed that has a small instance)")
    ap.add_argument("--trials", type=int, default=3, help="correctness trials per sampled seed")
    ap.add_argument("--timeout", type=int, default=180, help="seconds per problem for capture + codegen")
    ap.add_argument("--render", type=Path, help="only rewrite the markdown beside this result JSON")
    a = ap.parse_args(argv)
    if a.render:
        if not a.render.is_file():
            print(f"kb_coverage: {a.render}: no such file", file=sys.stderr)
            return 2
        doc = json.loads(a.render.read_text())
        doc["summary"] = summarise(doc["problems"])
        a.render.write_text(json.dumps(doc, indent=1, default=str))
        a.render.with_suffix(".md").write_text(markdown(doc["problems"], doc["summary"], doc["sample"], doc["meta"]))
        return 0
    os.environ.setdefault("TRITON_INTERPRET", "1")
    try:
        if a.sample != "all" and not a.sample.isdigit():
            raise CoverageError(f"--sample {a.sample!r}: a count or 'all'")
        n = -1 if a.sample == "all" else int(a.sample)
        doc = run(a.kernelbench, a.level or [1, 2], a.problem, a.out_dir, n, a.timeout, a.trials, a.stem)
    except CoverageError as exc:
        print(f"kb_coverage: {exc}", file=sys.stderr)
        return 2
    s = doc["summary"]
    print(json.dumps({k: s[k] for k in ("problems", "by_outcome", "seed_produced", "with_own_kernel_share")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
