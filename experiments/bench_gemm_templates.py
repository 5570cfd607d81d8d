"""GEMM templates (kernellab/compiler/kernels/gemm.py) against torch eager (cuBLAS) and torch.compile (default mode).

Cases: plain GEMM 4096^3 in bf16 and fp32 (IEEE, and the opt-in 3-pass TF32 "tf32x3"), linear + bias +
GELU (bf16), linear + softmax / layernorm / logsumexp at N = 1024..4096 (bf16) and at the shapes of the
bundled fp32 problems (fusions/linear_softmax, linear_layernorm, linear_logsumexp), a split-K skinny
GEMM and the persistent variant. Every row: do_bench median with p20/p80 (L2 flushed between
repetitions), TFLOP/s, speedup over eager and torch.compile, and the max abs error of eager and of
the template against one fp64 (fp32 inputs) or fp32 (half inputs) reference. Each template case runs
its default CONFIG and a few alternatives (``--quick`` skips them) and reports both.

GPU host (torch + triton only; gemm.py is loaded by path, no install needed):
    python experiments/bench_gemm_templates.py            # ~5-8 min on one H200
    python experiments/bench_gemm_templates.py --quick    # default configs only, ~2-3 min
    python experiments/bench_gemm_templates.py --only softmax
writes experiments/results/gemm_templates.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.util
import math
import platform
import re
import subprocess
import sys
import traceback
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.testing

ROOT = Path(__file__).resolve().parent.parent


def _load_gemm():
    kernels = ROOT / "kernellab" / "compiler" / "kernels"
    pkg = types.ModuleType("kl_kernels")
    pkg.__path__ = [str(kernels)]  # gemm.py's relative imports (template, gemm_launcher) resolve here
    sys.modules["kl_kernels"] = pkg
    spec = importlib.util.spec_from_file_location("kl_kernels.gemm", kernels / "gemm.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kl_kernels.gemm"] = mod
    spec.loader.exec_module(mod)
    return mod


G = _load_gemm()
GemmSpec, Operand = G.GemmSpec, G.Operand
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

# alternatives tried after the default CONFIG: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
SWEEP = {
    "half": [(128, 256, 64, 8, 3), (128, 128, 64, 8, 3), (128, 128, 64, 4, 4), (256, 128, 64, 8, 3),
             (64, 256, 64, 4, 4), (128, 128, 128, 8, 3), (64, 128, 64, 4, 4)],
    "fp32": [(128, 128, 32, 8, 3), (64, 64, 32, 4, 3), (128, 64, 32, 4, 3), (64, 128, 32, 4, 4),
             (128, 128, 16, 8, 4), (64, 64, 64, 4, 3), (128, 256, 32, 8, 2)],
}


@dataclass
class Case:
    name: str
    flops: float
    inputs: Callable[[], tuple]  # -> (x, w, *extra) on the GPU
    eager: Callable[..., torch.Tensor]
    spec: GemmSpec
    launch_args: Callable[[tuple], tuple]  # inputs -> (a, b, *extra) for the launcher
    ref: Callable[[tuple], torch.Tensor]  # high-precision reference


def _ident(name: str) -> str:
    return re.sub(r"\W+", "_", name).strip("_")


def _randn(*shape, dtype, scale=1.0):
    return (torch.randn(*shape, device="cuda") * scale).to(dtype)


def _linear_case(name, M, K, N, dtype, red, prec=None, persistent=False):
    """x [M, K] @ W[N, K]^T + bias, then the row reduction (None: GELU epilogue)."""
    dt = DT[dtype]
    ops = [Operand("bias", "row")]
    if red == "layernorm":
        ops += [Operand("ln_weight", "row"), Operand("ln_bias", "row")]
    epi = "acc = acc + bias"
    if red is None:
        epi += "\nacc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))"
    spec = GemmSpec(_ident(name), trans_b=True, dtype=dtype, operands=tuple(ops), epilogue=epi, row_reduction=red,
                    fp32_precision=prec, persistent=persistent)

    def inputs():
        x = _randn(M, K, dtype=dt)
        w = _randn(N, K, dtype=dt, scale=K**-0.5)
        b = _randn(N, dtype=dt, scale=0.1)
        lw = (torch.rand(N, device="cuda") + 0.5).to(dt)
        lb = _randn(N, dtype=dt, scale=0.5)
        return (x, w, b, lw, lb)

    def post(y, lw, lb):
        if red is None:
            return F.gelu(y)
        if red == "softmax":
            return torch.softmax(y, -1)
        if red == "layernorm":
            return F.layer_norm(y, (N,), lw, lb)
        if red == "logsumexp":
            return torch.logsumexp(y, -1)
        raise ValueError(red)

    def eager(x, w, b, lw, lb):
        return post(F.linear(x, w, b), lw, lb)

    def ref(t):
        x, w, b, lw, lb = t
        hp = torch.float64 if dtype == "float32" else torch.float32
        return post(F.linear(x.to(hp), w.to(hp), b.to(hp)), lw.to(hp), lb.to(hp))

    def largs(t):
        x, w, b, lw, lb = t
        return (x, w, b, lw, lb) if red == "layernorm" else (x, w, b)

    return Case(name, 2.0 * M * N * K, inputs, eager, spec, largs, ref)


def _mm_case(name, M, K, N, dtype, prec=None, split_k=1, persistent=False, B=None):
    dt = DT[dtype]
    spec = GemmSpec(_ident(name), batched=B is not None, dtype=dtype, fp32_precision=prec, split_k=split_k,
                    persistent=persistent)
    lead = (B,) if B is not None else ()

    def inputs():
        return (_randn(*lead, M, K, dtype=dt), _randn(*lead, K, N, dtype=dt, scale=K**-0.5))

    def ref(t):
        hp = torch.float64 if dtype == "float32" else torch.float32
        return t[0].to(hp) @ t[1].to(hp)

    return Case(name, 2.0 * M * N * K * (B or 1), inputs, lambda a, b: a @ b, spec, lambda t: t, ref)


def cases() -> list[Case]:
    out = [
        _mm_case("mm 4096^3 bf16", 4096, 4096, 4096, "bfloat16"),
        _mm_case("mm 4096^3 bf16 persistent", 4096, 4096, 4096, "bfloat16", persistent=True),
        _mm_case("mm 4096^3 fp32 ieee", 4096, 4096, 4096, "float32"),
        _mm_case("mm 4096^3 fp32 tf32x3", 4096, 4096, 4096, "float32", prec="tf32x3"),
        _mm_case("mm 256x256x65536 bf16 split-K 16", 256, 65536, 256, "bfloat16", split_k=16),
        _mm_case("bmm 96x1024x512x1024 fp32 tf32x3", 1024, 512, 1024, "float32", prec="tf32x3", B=96),
        _linear_case("linear+gelu 4096^3 bf16", 4096, 4096, 4096, "bfloat16", None),
    ]
    for red in ("softmax", "layernorm", "logsumexp"):
        for n in (1024, 2048, 4096):
            out.append(_linear_case(f"linear+{red} M=4096 K=4096 N={n} bf16", 4096, 4096, n, "bfloat16", red))
    # the bundled fp32 problems' full sizes, IEEE and tf32x3
    for red, (M, K, N) in (("softmax", (4096, 1024, 8192)), ("layernorm", (8192, 2048, 2048)),
                           ("logsumexp", (4096, 2048, 8192))):
        for prec in ("ieee", "tf32x3"):
            out.append(_linear_case(f"linear+{red} {M}x{K}->{N} fp32 {prec}", M, K, N, "float32", red, prec))
    return out


def timed(fn) -> tuple[float, float, float]:
    med, p20, p80 = triton.testing.do_bench(fn, quantiles=[0.5, 0.2, 0.8], warmup=25, rep=100)
    return med, p20, p80


def maxerr(y: torch.Tensor, ref: torch.Tensor) -> float:
    return (y.double() - ref.double()).abs().max().item()


def run_case(c: Case, quick: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    t = c.inputs()
    ref = c.ref(t)
    row: dict[str, Any] = {"case": c.name}
    y_e = c.eager(*t)
    row["eager_err"] = maxerr(y_e, ref)
    row["eager"] = timed(lambda: c.eager(*t))
    # every case's eager function shares one code object: reset so that dynamo compiles this case's
    # shapes statically instead of falling back to a dynamic-shape graph after the first recompile
    torch._dynamo.reset()
    comp = torch.compile(c.eager)
    comp(*t)
    row["compile"] = timed(lambda: comp(*t))
    ks = G.gemm_kernel(c.spec)
    fn = G.load_kernel(ks)
    args = c.launch_args(t)
    configs = [("default", dict(ks.config))]
    if not quick:
        fam = "fp32" if c.spec.dtype == "float32" else "half"
        for bm, bn, bk, w, s in SWEEP[fam]:
            cfg = {**ks.config, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s}
            if cfg != ks.config:
                configs.append((f"{bm}x{bn}x{bk} w{w} s{s}", cfg))
    best = None
    for label, cfg in configs:
        try:
            y = fn(*args, config=cfg)
            torch.cuda.synchronize()
            err = maxerr(y, ref)
            ms = timed(lambda cfg=cfg: fn(*args, config=cfg))
        except Exception as e:  # out of shared memory / registers: note it, go on
            row.setdefault("failed", []).append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:80]}")
            continue
        if label == "default":
            row["default"], row["default_err"] = ms, err
        if best is None or ms[0] < best[1][0]:
            best = (label, ms, err)
    if best:
        row["best_label"], row["best"], row["best_err"] = best
    row["tflops"] = c.flops
    return row


def env_lines() -> list[str]:
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
    except Exception:
        commit = "unknown"
    return [
        f"- date: {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}",
        f"- device: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).multi_processor_count} SMs)",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}, "
        f"python {platform.python_version()}, commit {commit}",
        "- timing: triton.testing.do_bench (L2 flushed per repetition), median [p20, p80] ms; "
        "torch.compile default mode; eager fp32 matmul is IEEE (allow_tf32 off)",
    ]


def fmt(row: dict) -> str:
    def ms(v):
        return f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" if v else "-"

    eager, comp = row["eager"][0], row["compile"][0]
    d, b = row.get("default"), row.get("best")
    tf = lambda v: f"{row['tflops'] / v[0] / 1e9:.0f}" if v else "-"
    sp = lambda v, base: f"{base / v[0]:.2f}x" if v else "-"
    return (
        f"| {row['case']} | {ms(row['eager'])} | {ms(row['compile'])} | {ms(d)} | {tf(d)} | "
        f"{sp(d, eager)} | {sp(d, comp)} | {row.get('best_label', '-')}: {ms(b)} | {sp(b, eager)} | {sp(b, comp)} | "
        f"{row['eager_err']:.2e} | {row.get('default_err', float('nan')):.2e} |"
    )


HEADER = (
    "| case | eager ms | compile ms | template (default) ms | TFLOP/s | vs eager | vs compile | best config: ms | "
    "best vs eager | best vs compile | eager max err | template max err |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="default CONFIG only, no sweep")
    ap.add_argument("--only", default="", help="run the cases whose name contains this text")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "gemm_templates.md"))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False  # eager fp32 baseline = IEEE SGEMM (the problems' default)
    rows, notes = [], []
    print(HEADER)
    for c in cases():
        if args.only and args.only not in c.name:
            continue
        try:
            row = run_case(c, args.quick)
        except Exception:
            notes.append(f"- {c.name}: FAILED\n```\n{traceback.format_exc()[-1500:]}\n```")
            print(notes[-1], flush=True)
            continue
        rows.append(row)
        print(fmt(row), flush=True)
        for f in row.get("failed", []):
            notes.append(f"- {c.name}: config {f}")
    geo = lambda key, base: math.exp(sum(math.log(r[base][0] / r[key][0]) for r in rows if key in r)
                                     / max(1, sum(1 for r in rows if key in r)))
    summary = (f"Geometric mean over {len(rows)} cases, default CONFIG: {geo('default', 'eager'):.2f}x vs eager, "
               f"{geo('default', 'compile'):.2f}x vs torch.compile; best config: {geo('best', 'eager'):.2f}x, "
               f"{geo('best', 'compile'):.2f}x.")
    print(summary)
    text = "\n".join(["# GEMM templates vs cuBLAS (eager) and torch.compile", "", *env_lines(), "",
                      "Command: `python experiments/bench_gemm_templates.py" + (" --quick" if args.quick else "")
                      + (f" --only '{args.only}'" if args.only else "") + "`", "", HEADER,
                      *[fmt(r) for r in rows], "", summary, "",
                      "Errors: max abs error against an fp64 reference (fp32 cases) or an fp32 one (half cases), "
                      "so eager's and the template's columns compare like with like.", "",
                      *(["## Notes", *notes] if notes else [])])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

