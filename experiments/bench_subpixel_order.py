"""The sub-pixel transposed conv's grid order, side by side: the builtin seed as generated (the phases of a tile
innermost in program_id(0)) against the same source with the phase-major grid it had before (one grid axis per
phase, ``tl.program_id(2)``), each judged and timed by the sandbox in the same run, alternating
new, old, old, new so that drift over the run weighs on both sides alike.

GPU host (full sizes; about 1-2 minutes a problem at KernelBench's sizes):
    PYTHONPATH=. python experiments/bench_subpixel_order.py [PROBLEM.py ...] [--out-dir experiments/results]
CPU smoke run (interpreter, SMALL sizes, correctness only; the numbers mean nothing):
    TRITON_INTERPRET=1 PYTHONPATH=. python experiments/bench_subpixel_order.py --small PROBLEM.py --out-dir /tmp/s

The default problems are KernelBench's level-2 2, 16 and 34 (``.kb`` or ../shared/kernelbench), whose seeds ran
the phase-major kernel on the H200 (ncu: 16x the input read, 2x the output written). Writes
``<date>-<device>-subpixel-order.md`` and ``.json``: per problem each side's status, median and p20-p80, eager's
median and the own-kernel share, and new/old. Exit 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KB = ROOT / ".kb" if (ROOT / ".kb").is_dir() else ROOT.parent / "shared" / "kernelbench"
DEFAULT = [KB / "level2" / n for n in ("2_ConvTranspose2d_BiasAdd_Clamp_Scaling_Clamp_Divide.py",
                                       "16_ConvTranspose2d_Mish_Add_Hardtanh_Scaling.py",
                                       "34_ConvTranspose3d_LayerNorm_GELU_Scaling.py")]
PHASE_INNER = re.compile(r"^(\s*)cls = pid % \(SD \* SH \* SW\)\n\s*pid = pid // \(SD \* SH \* SW\)$", re.M)
GRID_INNER = re.compile(r"grid = \(triton\.cdiv\(qmax, bm\) \* triton\.cdiv\(cout_g, bn\) \* (\d+), groups\)")


class OrderError(Exception):
    """Bad input: printed as one line, exit 2."""


def phase_major(source: str) -> str:
    """``source`` with the grid of before: the phase read from a grid axis of its own."""
    if not PHASE_INNER.search(source) or not GRID_INNER.search(source):
        raise OrderError("no sub-pixel transposed conv in this source (stride > 1, no dilation)")
    source = PHASE_INNER.sub(lambda m: f"{m.group(1)}cls = tl.program_id(2)", source)
    return GRID_INNER.sub(lambda m: f"grid = (triton.cdiv(qmax, bm) * triton.cdiv(cout_g, bn), groups, {m.group(1)})",
                          source)


def _side(result: dict) -> dict:
    details = result.get("details") or {}
    return {k: result.get(k) for k in ("status", "median_ms", "p20_ms", "p80_ms", "eager_ms", "own_kernel_share",
                                        "error_class")} | {"gpu_s": details.get("gpu_s")}


def run(paths: list[Path], small: bool, device: str | None) -> list[dict]:
    from kernellab import sandbox
    from kernellab.agents.builtin import build
    from kernellab.problem import load_problem

    rows = []
    for path in paths:
        problem = load_problem(path)
        new = build(problem).source
        sources = {"new": new, "old": phase_major(new)}
        got: dict[str, list[dict]] = {"new": [], "old": []}
        for side in ("new", "old", "old", "new"):
            result = sandbox.evaluate(problem, sources[side], small=small, device=device, timing=not small)
            got[side].append(_side(result))
            print(f"bench_subpixel_order: {problem.name} {side}: {result.get('status')} "
                  f"{result.get('median_ms')} ms", file=sys.stderr, flush=True)
        row = {"problem": problem.name, "new": got["new"], "old": got["old"]}
        med = {s: [r["median_ms"] for r in got[s] if r["status"] == "correct" and r["median_ms"]] for s in got}
        if all(len(v) == 2 for v in med.values()):
            row["new_ms"], row["old_ms"] = statistics.mean(med["new"]), statistics.mean(med["old"])
            row["old_over_new"] = row["old_ms"] / row["new_ms"]
        rows.append(row)
    return rows


def page(rows: list[dict], meta: dict) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    out = [f"# Sub-pixel transposed conv: phases innermost (new) against phase-major (old), {meta['date']}", "",
           f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}; kernellab {meta['commit']}. "
           "Each side run twice, new, old, old, new, each a sandbox evaluation (correctness trials, then timing "
           "with eager beside it); the ms below are the mean of the two medians.", "",
           "| problem | new ms | old ms | old / new | statuses (new; old) | eager ms | own-kernel share (new; old) |",
           "|---|---|---|---|---|---|---|"]
    for r in rows:
        st = "; ".join(",".join(str(x["status"]) for x in r[s]) for s in ("new", "old"))
        share = "; ".join(",".join(ms(x["own_kernel_share"]) for x in r[s]) for s in ("new", "old"))
        eagers = [x["eager_ms"] for x in r["new"] + r["old"] if x.get("eager_ms")]
        eager = ms(statistics.mean(eagers) if eagers else None)
        ratio = f"{r['old_over_new']:.2f}x" if "old_over_new" in r else "-"
        out.append(f"| {r['problem']} | {ms(r.get('new_ms'))} | {ms(r.get('old_ms'))} | {ratio} | {st} | {eager} | {share} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="*", type=Path, help="problem files (default: KernelBench level-2 2, 16, 34)")
    ap.add_argument("--small", action="store_true", help="SMALL sizes on the CPU: correctness only")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "experiments" / "results")
    args = ap.parse_args(argv)
    paths = args.problems or DEFAULT
    try:
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise OrderError(f"no problem file {missing[0]}")
        import torch
        import triton

        device = "cpu" if args.small else "cuda"
        if device == "cuda" and not torch.cuda.is_available():
            raise OrderError("no CUDA device: run it on the GPU host, or --small on the CPU")
        rows = run(paths, args.small, device)
    except OrderError as exc:
        print(f"bench_subpixel_order: {exc}", file=sys.stderr)
        return 2
    from kernellab import env
    from kernellab.fileio import write_result_pages

    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": name,
            "torch": torch.__version__, "triton": triton.__version__, "commit": env.git_commit() or "unknown"}
    stem = write_result_pages(args.out_dir, "subpixel-order", meta["date"], name, page(rows, meta), {**meta, "rows": rows})
    print(f"bench_subpixel_order: {stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
