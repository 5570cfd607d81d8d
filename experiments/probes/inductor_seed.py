"""Does the Inductor seed start no worse than torch.compile? For each problem: make the seed
(``kernellab/agents/builtin/inductor.py``: torch.compile's own output module wrapped as a ModelNew), judge it in the
sandbox with a winner-style re-timing (the job compiles the reference with torch.compile itself and times
candidate, eager and torch.compile interleaved), and print its time next to torch.compile's.

    python experiments/probes/inductor_seed.py                       # a few KernelBench level-1/2 files
    python experiments/probes/inductor_seed.py path/to/problem.py ...  # or these files
    KERNELBENCH_DIR=/path/to/kernelbench python experiments/probes/inductor_seed.py --json out.json

Expected on the H200: status correct, seed/compile time ratio ~1.0 (same kernels; the wrapper skips
torch.compile's guards and AOTAutograd's runtime wrapper), an own-kernel share > 0 wherever Inductor wrote
Triton kernels. A problem without a seed prints the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
KB = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
DEFAULT = [
    "level1/19_ReLU.py", "level1/23_Softmax.py", "level1/33_BatchNorm.py", "level1/40_LayerNorm.py",
    "level1/63_conv_standard_2D__square_input__square_kernel.py",
    "level2/33_Gemm_Scale_BatchNorm.py", "level2/21_Conv2d_Add_Scale_Sigmoid_GroupNorm.py",
    "level2/45_Gemm_Sigmoid_LogSumExp.py", "level2/99_Matmul_GELU_Softmax.py",
]


def probe(path: Path, executor, device: str) -> dict:
    from kernellab.agents.builtin.inductor import InductorSeedError, inductor_seed
    from kernellab.problem import load_problem
    from kernellab.sandbox import EvalJob

    row: dict = {"problem": path.name}
    problem = load_problem(path)
    t0 = time.perf_counter()
    try:
        code = inductor_seed(problem, device)
    except InductorSeedError as exc:
        row.update(status="no seed", reason=str(exc), seed_s=round(time.perf_counter() - t0, 1))
        return row
    meta = code.meta["inductor"]
    row.update(seed_s=round(time.perf_counter() - t0, 1), triton_kernels=len(meta["triton_kernels"]),
               extern=meta["extern"], args=meta["args"])
    r = executor.submit(EvalJob(problem, code.source, device=device, retime=True)).result()
    row.update(status=r["status"], error=(r.get("error_text") or "")[:300] or None, seed_ms=r["median_ms"],
               compile_ms=r["compile_ms"], eager_ms=r["eager_ms"], speedup_compile=r["speedup_compile"],
               speedup_eager=r["speedup_eager"], own_kernel_share=r["own_kernel_share"],
               library_only=r["library_only"], own_kernels=(r.get("details") or {}).get("own_kernels"))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="*", help=f"problem files [a few KernelBench level-1/2 files under {KB}]")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", default=None, help="also write the rows to this file")
    args = ap.parse_args()
    paths = [Path(p) for p in args.problems] or [KB / p for p in DEFAULT]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        sys.exit(f"inductor_seed: no such problem file(s): {', '.join(missing)} (set KERNELBENCH_DIR?)")
    from kernellab.sandbox import LocalExecutor

    executor = LocalExecutor()
    rows = []
    try:
        for p in paths:
            row = probe(p, executor, args.device)
            rows.append(row)
            ratio = (f"{row['seed_ms'] / row['compile_ms']:.3f}" if row.get("seed_ms") and row.get("compile_ms")
                     else "-")
            print(f"{row['problem'][:48]:48} {row['status']:>14} seed {row.get('seed_ms') or '-'} ms  "
                  f"compile {row.get('compile_ms') or '-'} ms  seed/compile {ratio}  "
                  f"own share {row.get('own_kernel_share')}  kernels {row.get('triton_kernels', '-')}  "
                  f"{row.get('reason') or row.get('error') or ''}", flush=True)
    finally:
        executor.shutdown()
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))


if __name__ == "__main__":
    main()
