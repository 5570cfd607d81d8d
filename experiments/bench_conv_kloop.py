"""Our own TF32 conv's K loop, side by side: the builtin ``tf32rn`` child (our conv, operands rounded as cuDNN rounds
them) as generated now (tap-major where a group has 16+ input channels, on channels-innermost copies of the input
and the weight, the rounding by ``cvt.rna.tf32.f32``), the same on the NCHW tensors as given (``NHWC=0``: no copy,
one float a load across the channels' planes), the same child with the flat K order (``TAP_MAJOR=0``: what the
tap-major order alone is worth), and the child as the base commit generated it (the flat loop with its 2-D index
arithmetic, the rounding by bit arithmetic, and the tiles it defaulted to, 128x64x32 on four warps, where the others
start from 64x128x16 on two). Each a sandbox evaluation (correctness trials, then timing with eager beside it) in
one run, in the order new, nchw, flat, base, base, flat, nchw, new, so that drift weighs on every side alike;
cuDNN's seed once, the time to beat.
``--sides`` picks others (new first), ``w4`` among them: four warps, where the default's two run ``mma.sync`` and
Hopper's ``wgmma`` needs a warpgroup of four.

The base sources are built on a machine with the repository's history (the GPU host's copy may lack it), then
carried to the GPU host as an ignored folder:
    PYTHONPATH=. python experiments/bench_conv_kloop.py --make-base .convbase [--base a049370] [PROBLEM.py ...]
GPU host (full sizes; about 3-4 minutes a problem):
    PYTHONPATH=. python experiments/bench_conv_kloop.py --base-dir .convbase [PROBLEM.py ...] [--out-dir DIR]
CPU smoke run (interpreter, SMALL sizes, the ieee child: correctness only; the numbers mean nothing):
    TRITON_INTERPRET=1 PYTHONPATH=. python experiments/bench_conv_kloop.py --small --base-dir DIR PROBLEM.py --out-dir DIR

The default problems are KernelBench's level-2 17 (Conv2d 64->128, 3x3, no padding) and 10 (ConvTranspose2d
64->64, 3x3, stride 1, padding 1), whose tf32rn children ran 1.5x and 1.9x slower than the whole eager problem on
the H200 even after tuning. Writes ``<date>-<device>-conv-kloop.md`` and ``.json``. Exit 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
KB = ROOT / ".kb" if (ROOT / ".kb").is_dir() else ROOT.parent / "shared" / "kernelbench"
DEFAULT = [KB / "level2" / n for n in ("17_Conv2d_InstanceNorm_Divide.py", "10_ConvTranspose2d_MaxPool_Hardtanh_Mean_Tanh.py")]
BASE = "a049370"  # the last commit before the tap-major loop
# each side: the child's config beside the generated one ("base": the base commit's child); what it isolates
SIDES = {"new": ({}, "as generated"), "nchw": ({"NHWC": 0}, "on the NCHW tensors as given"),
         "flat": ({"TAP_MAJOR": 0}, "the flat K loop"), "w4": ({"num_warps": 4}, "four warps (Hopper's wgmma)"),
         "base": (None, "the base commit's child")}
DEFAULT_SIDES = ("new", "nchw", "flat", "base")
# our conv at cuDNN's TF32 rounding on the GPU (whose reference is cuDNN in TF32); on the CPU, whose reference is exact,
# at ieee (the same K loop, judged correct there)
PRECISION = {False: "tf32rn", True: "ieee"}

# a child source: the problem's single conv group at a precision, with extra config (run in the tree being measured, or
# in the base commit's tree by --make-base)
_CHILD = r"""
import sys
from pathlib import Path
from kernellab.agents.builtin import Precision, SetConfig, build, built
from kernellab.problem import load_problem

p = load_problem(Path(sys.argv[1]), validate_run=False)
convs = [g for g in built(p).groups if g.kind == "conv"]
if len(convs) != 1:
    sys.exit(f"{p.name}: {len(convs)} conv groups, not one")
acts = [Precision(convs[0].id, sys.argv[2])]
if len(sys.argv) > 3:
    acts.append(SetConfig(convs[0].id, tuple((k, int(v)) for k, v in (a.split("=") for a in sys.argv[3:])), "K loop"))
sys.stdout.write(build(p, acts).source)
"""


class KloopError(Exception):
    """Bad input: printed as one line, exit 2."""


def child_source(path: Path, tree: Path, precision: str, **config: int) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("TRITON_INTERPRET", None)  # the source does not depend on it; building needs no kernel run
    args = [sys.executable, "-c", _CHILD, str(path), precision] + [f"{k}={v}" for k, v in config.items()]
    proc = subprocess.run(args, cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise KloopError((proc.stderr.strip().splitlines() or ["building the child failed"])[-1])
    return proc.stdout


def make_base(paths: list[Path], out: Path, ref: str) -> None:
    """The base commit's children of each problem into ``out/<stem>.<precision>.py`` (``git archive`` of ``ref``): tf32rn
    for the GPU, ieee for the CPU's smoke run."""
    with tempfile.TemporaryDirectory() as tmp:
        arc = Path(tmp) / "base.tar"
        proc = subprocess.run(["git", "archive", "-o", str(arc), ref, "kernellab"], cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            raise KloopError(f"git archive {ref}: {proc.stderr.strip()[:200]}")
        with tarfile.open(arc) as t:
            t.extractall(tmp, filter="data")
        out.mkdir(parents=True, exist_ok=True)
        for path in paths:
            for precision in PRECISION.values():
                (out / f"{path.stem}.{precision}.py").write_text(child_source(path, Path(tmp), precision))
            print(f"bench_conv_kloop: {out / path.stem}.*.py ({ref})", file=sys.stderr)


def _side(result: dict) -> dict:
    details = result.get("details") or {}
    return {k: result.get(k) for k in ("status", "median_ms", "p20_ms", "p80_ms", "eager_ms", "compile_ms",
                                        "own_kernel_share", "error_class")} | {"gpu_s": details.get("gpu_s")}


def order(sides: tuple[str, ...]) -> tuple[str, ...]:
    """Each side twice, there and back (new, nchw, flat, base, base, flat, nchw, new)."""
    return (*sides, *reversed(sides))


def run(paths: list[Path], base_dir: Path | None, small: bool, device: str | None,
        sides: tuple[str, ...] = DEFAULT_SIDES, precision: str | None = None) -> list[dict]:
    from kernellab import sandbox
    from kernellab.agents.builtin import build
    from kernellab.problem import load_problem

    rows = []
    for path in paths:
        problem = load_problem(path)
        precision = precision or PRECISION[bool(small)]
        sources = {s: (base_dir / f"{path.stem}.{precision}.py").read_text() if SIDES[s][0] is None
                   else child_source(path, ROOT, precision, **SIDES[s][0]) for s in sides}
        got: dict[str, list[dict]] = {s: [] for s in sides}
        for side in order(sides):
            result = sandbox.evaluate(problem, sources[side], small=small, device=device, timing=not small)
            got[side].append(_side(result))
            print(f"bench_conv_kloop: {problem.name} {side}: {result.get('status')} {result.get('median_ms')} ms",
                  file=sys.stderr, flush=True)
        seed = _side(sandbox.evaluate(problem, build(problem).source, small=small, device=device, timing=not small))
        row = {"problem": problem.name, **got, "seed": seed}
        med = {s: [r["median_ms"] for r in got[s] if r["status"] == "correct" and r["median_ms"]] for s in sides}
        for s in sides:
            if len(med[s]) == 2:
                row[f"{s}_ms"] = statistics.mean(med[s])
        for s in sides:
            if s != "new" and "new_ms" in row and f"{s}_ms" in row:
                row[f"{s}_over_new"] = row[f"{s}_ms"] / row["new_ms"]
        rows.append(row)
    return rows


def page(rows: list[dict], meta: dict) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.4g}"

    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}x"

    sides = tuple(meta["sides"])
    others = [s for s in sides if s != "new"]
    what = "; ".join(f"{s}: {SIDES[s][1]}" for s in sides)
    out = [f"# Our TF32 conv's K loop, side by side ({', '.join(sides)}), {meta['date']}", "",
           f"Device: {meta['device']}; torch {meta['torch']}, triton {meta['triton']}; kernellab {meta['commit']}, base "
           f"{meta['base']}. The builtin {meta['precision']} child at its default config ({what}; the base side at the base "
           f"commit's default tiles), each side run twice ({', '.join(order(sides))}), each a sandbox evaluation "
           "(correctness trials, then timing with eager beside it); the ms below are the mean of the two medians. The "
           "seed (cuDNN's conv + our epilogue) once, the time to beat.", "",
           "| problem | " + " | ".join(f"{s} ms" for s in sides) + " | " + " | ".join(f"{s} / new" for s in others)
           + f" | seed (cuDNN) ms | eager ms | statuses ({'; '.join(sides)}) |",
           "|---|" + "---|" * (len(sides) + len(others) + 3)]
    for r in rows:
        st = "; ".join(",".join(str(x["status"]) for x in r[s]) for s in sides)
        eagers = [x["eager_ms"] for s in sides for x in r[s] if x.get("eager_ms")]
        seed = r["seed"]["median_ms"] if r["seed"]["status"] == "correct" else None
        cells = [ms(r.get(f"{s}_ms")) for s in sides] + [ratio(r.get(f"{s}_over_new")) for s in others]
        out.append(f"| {r['problem']} | " + " | ".join(cells)
                   + f" | {ms(seed)} | {ms(statistics.mean(eagers) if eagers else None)} | {st} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="*", type=Path, help="problem files with one conv (default: KernelBench level-2 17, 10)")
    ap.add_argument("--make-base", type=Path, metavar="DIR", help="build the base commit's children into DIR, then stop")
    ap.add_argument("--base", default=BASE, help=f"the base commit for --make-base (default {BASE})")
    ap.add_argument("--base-dir", type=Path, metavar="DIR", help="the base children --make-base built")
    ap.add_argument("--sides", default=",".join(DEFAULT_SIDES),
                    help=f"comma-separated, new first, of {', '.join(SIDES)} (default {','.join(DEFAULT_SIDES)})")
    ap.add_argument("--small", action="store_true", help="SMALL sizes on the CPU: correctness only")
    ap.add_argument("--precision", choices=("tf32rn", "tf32x3", "ieee"),
                    help="the child's dot precision (default tf32rn on the GPU, ieee with --small; the base side has "
                         "the two --make-base builds)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "experiments" / "results")
    args = ap.parse_args(argv)
    paths = args.problems or DEFAULT
    try:
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise KloopError(f"no problem file {missing[0]}")
        if args.make_base:
            make_base(paths, args.make_base, args.base)
            return 0
        sides = tuple(x.strip() for x in args.sides.split(",") if x.strip())
        if not sides or sides[0] != "new" or len(set(sides)) != len(sides) or set(sides) - set(SIDES):
            raise KloopError(f"--sides takes distinct sides of {', '.join(SIDES)}, new first, got {args.sides!r}")
        if "base" in sides and args.base_dir is None:
            raise KloopError("--base-dir DIR is required (build it with --make-base DIR where git history is)")
        precision = args.precision or PRECISION[args.small]
        lacking = [p.stem for p in paths if "base" in sides and not (args.base_dir / f"{p.stem}.{precision}.py").is_file()]
        if lacking:
            raise KloopError(f"no base source {args.base_dir / lacking[0]}.{precision}.py: build it with --make-base")
        import torch
        import triton

        device = "cpu" if args.small else "cuda"
        if device == "cuda" and not torch.cuda.is_available():
            raise KloopError("no CUDA device: run it on the GPU host, or --small on the CPU")
        rows = run(paths, args.base_dir, args.small, device, sides, precision)
    except KloopError as exc:
        print(f"bench_conv_kloop: {exc}", file=sys.stderr)
        return 2
    from kernellab import env
    from kernellab.fileio import write_result_pages

    name = torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu"
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": name,
            "torch": torch.__version__, "triton": triton.__version__, "commit": env.git_commit() or "unknown", "base": args.base,
            "precision": precision, "sides": list(sides)}
    stem = write_result_pages(args.out_dir, "conv-kloop", meta["date"], name, page(rows, meta), {**meta, "rows": rows})
    print(f"bench_conv_kloop: {stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
