"""Time each problem of a suite in eager PyTorch at full size and flag sizes outside 0.5-15 ms.

GPU host (needs only torch and this repository on PYTHONPATH):
    PYTHONPATH=. python experiments/measure_eager.py --suite experiments/suites/full.txt
writes experiments/results/eager_sizes.md (table + device, versions, date, commit) and a .json twin.
CPU smoke run of the script itself (SMALL sizes, wall-clock timing, nothing flagged):
    PYTHONPATH=. python experiments/measure_eager.py --suite experiments/suites/ci.txt --small --out /tmp/e.md
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a plain script from anywhere
    sys.path.insert(0, str(ROOT))

from kernellab.problem import Problem, instantiate, load_problem, output_tensors  # noqa: E402

LOW_MS, HIGH_MS = 0.5, 15.0
# Larger than any current GPU's L2 (H200: 60 MB), so each repetition starts with cold caches as in the sandbox.
FLUSH_BYTES = 256 << 20
_ESTIMATE = re.compile(r"~\s*([\d.]+(?:-[\d.]+)?)\s*ms")


def read_suite(path: str | Path) -> list[str]:
    """Problem paths of a suite file: one per line, relative to the repository root; `#` starts a comment."""
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def docstring_estimate(problem: Problem) -> str:
    """The main term of the 'Eager H200 estimate' line of the problem's docstring ('' when absent)."""
    for line in problem.source.splitlines():
        if "estimate" in line.lower():
            m = _ESTIMATE.search(line)
            return m.group(1) if m else ""
    return ""


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def time_problem(problem: Problem, device: str, small: bool, warmup: int, reps: int, build_on_device: bool) -> dict:
    t0 = time.perf_counter()
    # Building on the device (factory calls default to it) avoids generating gigabytes of inputs on the CPU;
    # the values differ from a CPU build, which does not matter for timing.
    ctx = torch.device(device) if build_on_device else torch.device("cpu")
    with ctx:
        inst = instantiate(problem, small=small, seed=0, device=device)
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    build_s = time.perf_counter() - t0
    times: list[float] = []
    with torch.no_grad():
        out = inst.model(*inst.inputs)
        finite = all(torch.isfinite(o).all().item() for o in output_tensors(out) if o.is_floating_point())
        del out
        for _ in range(warmup):
            inst.model(*inst.inputs)
        if cuda:
            flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
            for start, end in events:
                flush.zero_()
                start.record()
                inst.model(*inst.inputs)
                end.record()
            torch.cuda.synchronize()
            times = [s.elapsed_time(e) for s, e in events]
            del flush
        else:
            for _ in range(reps):
                t = time.perf_counter()
                inst.model(*inst.inputs)
                times.append((time.perf_counter() - t) * 1e3)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if cuda else None
    del inst
    return {
        "median_ms": statistics.median(times),
        "p20_ms": _quantile(times, 0.2),
        "p80_ms": _quantile(times, 0.8),
        "build_s": build_s,
        "peak_gb": peak_gb,
        "finite": finite,
    }


def _flag(row: dict, judged: bool) -> str:
    if "error" in row:
        return "ERROR"
    if not row["finite"]:
        return "non-finite output"
    if not judged:
        return ""
    if row["median_ms"] < LOW_MS:
        return f"below {LOW_MS} ms"
    if row["median_ms"] > HIGH_MS:
        return f"above {HIGH_MS} ms"
    return ""


def environment(device: str) -> dict:
    env = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.processor() or "cpu",
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
    }
    for key, cmd in (("driver", ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
                     ("commit", ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])):
        try:
            env[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except Exception:  # no nvidia-smi / not a git checkout: leave it out rather than fail the measurement
            env[key] = "unknown"
    return env


def render(rows: list[dict], env: dict, args: argparse.Namespace, judged: bool) -> str:
    lines = [
        "# Eager PyTorch times of the problem suite at full size" if not args.small else
        "# Eager PyTorch times of the problem suite at SMALL sizes (smoke run, not a measurement)",
        "",
        f"Suite `{args.suite}`; CUDA events, {args.warmup} warm-up calls, median of {args.reps} repetitions with p20/p80, "
        f"L2 flushed ({FLUSH_BYTES >> 20} MB write) before each; target range {LOW_MS}-{HIGH_MS} ms."
        if judged else f"Suite `{args.suite}`; wall-clock, {args.warmup} warm-up calls, median of {args.reps}.",
        "",
        "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items()),
        "",
        "| problem | dtype | median ms | p20 | p80 | docstring est. ms | build s | peak GB | flag |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['problem']} | {r['dtype']} | | | | {r['estimate']} | | | ERROR: {r['error'][:120]} |")
            continue
        peak = f"{r['peak_gb']:.1f}" if r["peak_gb"] is not None else ""
        lines.append(f"| {r['problem']} | {r['dtype']} | {r['median_ms']:.3f} | {r['p20_ms']:.3f} | {r['p80_ms']:.3f} | "
                     f"{r['estimate']} | {r['build_s']:.1f} | {peak} | {r['flag']} |")
    flagged = [r for r in rows if r["flag"]]
    lines += ["", f"{len(rows)} problems, {len(rows) - len(flagged)} in range, {len(flagged)} flagged"
              + (": " + ", ".join(f"{r['problem']} ({r['flag']})" for r in flagged) if flagged else "") + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", default=str(ROOT / "experiments/suites/full.txt"))
    ap.add_argument("--out", default=str(ROOT / "experiments/results/eager_sizes.md"))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--small", action="store_true", help="SMALL sizes (a smoke test of this script)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cpu-build", action="store_true",
                    help="build weights and inputs on the CPU as the sandbox does (slow for multi-GB problems)")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error("no CUDA device: use --device cpu --small for a smoke run")
    judged = args.device.startswith("cuda") and not args.small
    env = environment(args.device)
    rows = []
    for rel in read_suite(args.suite):
        path = ROOT / rel if not Path(rel).is_absolute() else Path(rel)
        row: dict = {"problem": rel.removeprefix("experiments/problems/").removesuffix(".py")}
        try:
            problem = load_problem(path)
            row["dtype"] = problem.settings()["dtype"]
            row["estimate"] = docstring_estimate(problem)
            row.update(time_problem(problem, args.device, args.small, args.warmup, args.reps,
                                    build_on_device=not args.cpu_build))
        except Exception as exc:  # one bad problem (e.g. out of memory) must not stop the table
            row.setdefault("dtype", "?")
            row.setdefault("estimate", "")
            row["error"] = f"{type(exc).__name__}: {exc}".replace("\n", " ").replace("|", "/")
        row["flag"] = _flag(row, judged)
        rows.append(row)
        shown = f"{row['median_ms']:9.3f} ms" if "median_ms" in row else "    error"
        print(f"{row['problem']:40s} {row['dtype']:9s} {shown}  est {row['estimate'] or '-':>8s}  {row['flag']}", flush=True)
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(rows, env, args, judged))
    out.with_suffix(".json").write_text(json.dumps({"environment": env, "suite": args.suite, "small": args.small,
                                                    "reps": args.reps, "rows": rows}, indent=1))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
