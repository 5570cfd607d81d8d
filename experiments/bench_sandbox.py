"""Sandbox performance on the GPU host: overhead, pool throughput, repeatability.

    PYTHONPATH=. python experiments/bench_sandbox.py [--out experiments/results/sandbox.md]

Needs only torch and triton plus kernellab (no store: the torch.compile baseline is cached in a
dict shared by the executors here). Targets (issue 3):
  1. overhead: one evaluation (5 correctness trials + timing) of an already-compiled Triton
     candidate of a ~1 ms problem takes <= 3 s;
  2. throughput: 8 different Triton candidates (never compiled before: a fresh Triton cache) through
     the pool on one GPU finish >= 3x faster than one after another on one worker;
  3. repeatability: two evaluations of the same candidate give medians within 2%.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernellab.sandbox import EvalJob, LocalExecutor  # noqa: E402

from kernellab import Problem  # noqa: E402
from kernellab.env import versions  # noqa: E402

# gemm_bias_gelu at 4096 x 2048 -> 4096: about 1.3 ms in eager fp32 on an H200 (cuBLAS ~51 TFLOP/s)
PROBLEM_SRC = (ROOT / "experiments/problems/fusions/gemm_bias_gelu.py").read_text()
PROBLEM_SRC = re.sub(r"^in_features = \d+", "in_features = 2048", PROBLEM_SRC, flags=re.M)
CAND_SRC = (ROOT / "experiments/candidates/gemm_bias_gelu_triton.py").read_text()
# Eight tile configurations: eight different compiled kernels.
VARIANTS = [(64, 64, 32, 4), (128, 64, 32, 4), (64, 128, 32, 4), (128, 128, 32, 8),
            (32, 64, 32, 4), (64, 32, 32, 4), (128, 64, 16, 8), (64, 64, 16, 4)]


class BaselineCache:
    """The store's two baseline methods, in memory."""

    def __init__(self) -> None:
        self.rows: dict = {}

    def get_baseline(self, key):
        return self.rows.get(key)

    def put_baseline(self, key, row):
        self.rows[key] = dict(row)


def variant(i: int) -> str:
    bm, bn, bk, nw = VARIANTS[i]
    cfg = (f'CONFIG = {{"BLOCK_M": {bm}, "BLOCK_N": {bn}, "BLOCK_K": {bk}, "GROUP_M": 8, '
           f'"PRECISION": "ieee", "num_warps": {nw}, "num_stages": 3}}')
    src = re.sub(r"^CONFIG = \{.*?\}\n", cfg + "\n", CAND_SRC, count=1, flags=re.M | re.S)
    return src + f"\n# benchmark variant {i}\n"


def _gb(n) -> str:
    return "-" if n is None else f"{n / 1e9:.2f}"


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "experiments/results/sandbox.md"))
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_sandbox.py needs a CUDA device")
    problem = Problem(name="gemm_bias_gelu_4096x2048x4096", source=PROBLEM_SRC)
    cache = BaselineCache()
    raw: dict = {}

    # 1. overhead of one evaluation of an already-compiled candidate (worker warm, baseline cached)
    with LocalExecutor(workers_per_gpu=1) as ex:
        ex.start("cuda")
        first, t_first = timed(lambda: ex.submit(EvalJob(problem, CAND_SRC, store=cache)).result())
        assert first["status"] == "correct", first["error_text"]
        second, t_second = timed(lambda: ex.submit(EvalJob(problem, CAND_SRC, store=cache)).result())
        third, t_third = timed(lambda: ex.submit(EvalJob(problem, CAND_SRC, store=cache)).result())
    overhead = min(t_second, t_third)
    raw["overhead"] = {"first_s": t_first, "second_s": t_second, "third_s": t_third,
                       "candidate_ms": second["median_ms"], "eager_ms": second["eager_ms"],
                       "compile_ms": second["compile_ms"], "reps": second["details"]["timing"]["candidate"]["reps"]}

    # 3. repeatability: the medians of the two warm evaluations
    m2, m3 = second["median_ms"], third["median_ms"]
    rep_pct = 100 * abs(m2 - m3) / min(m2, m3)
    raw["repeatability"] = {"median_a_ms": m2, "median_b_ms": m3, "diff_pct": rep_pct,
                            "band_a": [second["p20_ms"], second["p80_ms"]], "band_b": [third["p20_ms"], third["p80_ms"]]}

    # 2. throughput: 8 new candidates, fresh Triton caches, workers already started in both runs
    def run(workers: int, concurrent: bool) -> tuple[float, list[dict]]:
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="kernellab-bench-triton-")
        with LocalExecutor(workers_per_gpu=workers) as ex:
            ex.start("cuda")
            t0 = time.perf_counter()
            if concurrent:
                futs = [ex.submit(EvalJob(problem, variant(i), store=cache)) for i in range(8)]
                res = [f.result() for f in futs]
            else:
                res = [ex.submit(EvalJob(problem, variant(i), store=cache)).result() for i in range(8)]
            return time.perf_counter() - t0, res

    saved = os.environ.get("TRITON_CACHE_DIR")
    t_seq, res_seq = run(1, False)
    t_pool, res_pool = run(8, True)
    if saved is None:
        os.environ.pop("TRITON_CACHE_DIR", None)
    else:
        os.environ["TRITON_CACHE_DIR"] = saved
    statuses = [r["status"] for r in res_seq + res_pool]
    raw["throughput"] = {"sequential_s": t_seq, "pool_s": t_pool, "ratio": t_seq / t_pool, "statuses": statuses,
                         "medians_ms": [r["median_ms"] for r in res_pool]}

    # where the seconds went: the executor's per-phase wall times (waits for the GPU's lock apart)
    def phases(results: list[dict]) -> dict[str, float]:
        tot: dict[str, float] = {}
        for r in results:
            for k, v in (r["details"].get("phase_s") or {}).items():
                tot[k] = tot.get(k, 0.0) + v
        return {k: round(v / max(1, len(results)), 3) for k, v in sorted(tot.items(), key=lambda kv: -kv[1])}

    raw["phases_mean_s"] = {"warm_evaluation": phases([second, third]), "sequential": phases(res_seq),
                            "pool": phases(res_pool)}
    # admission to the GPU's memory budget happens before a job's phases: a pool that does not overlap shows here,
    # and a job retried after running out of its grant says so (its earlier attempts, their grants and peaks)
    def memory(r: dict) -> dict:
        m = r["details"].get("memory", {})
        out = {k: m.get(k) for k in ("budget_bytes", "need_bytes", "grant_bytes", "alone", "alone_reason",
                                     "admission_wait_s", "reference_peak_bytes", "peak_bytes", "estimate_error")}
        out["retries"] = [{k: a.get(k) for k in ("error_class", "grant_bytes", "alone", "peak_bytes")}
                          for a in r["details"].get("retries") or []]
        first = r["details"].get("retried_after")
        if first:  # the first failure's class and the end of its error (the traceback's last lines)
            out["retried_after"] = {"error_class": first.get("error_class"),
                                    "error_text": (first.get("error_text") or "")[-600:]}
        return out

    raw["sequential_memory"] = [memory(r) for r in res_seq]
    raw["pool_memory"] = [memory(r) for r in res_pool]

    v = versions()
    dev = torch.cuda.get_device_name(0)
    ok = lambda b: "yes" if b else "NO"  # noqa: E731
    lines = [
        "# Sandbox performance",
        "",
        f"- date: {dt.datetime.now(dt.timezone.utc).isoformat(timespec='seconds')}",
        f"- device: {dev}",
        f"- versions: torch {v['torch']}, CUDA {v['cuda']}, triton {v['triton']}, driver {v.get('driver')}, "
        f"python {v['python']}, kernellab {v['kernellab']} ({v['commit']})",
        f"- problem: gemm_bias_gelu at 4096x2048 -> 4096 fp32 (eager {second['eager_ms']:.3f} ms, "
        f"torch.compile {second['compile_ms'] or float('nan'):.3f} ms); candidate "
        f"experiments/candidates/gemm_bias_gelu_triton.py ({second['median_ms']:.3f} ms)",
        "",
        "| figure | measured | target | met |",
        "|---|---|---|---|",
        f"| overhead of one evaluation, compiled candidate (5 trials + timing) | {overhead:.2f} s "
        f"(first, compiling: {t_first:.1f} s) | <= 3 s | {ok(overhead <= 3)} |",
        f"| 8 new Triton candidates: one worker, one after another / pool of 8 on one GPU | {t_seq:.1f} s / "
        f"{t_pool:.1f} s = {t_seq / t_pool:.2f}x | >= 3x | {ok(t_seq / t_pool >= 3)} |",
        f"| repeatability: medians of two evaluations | {m2:.4f} / {m3:.4f} ms ({rep_pct:.2f}%) | <= 2% | "
        f"{ok(rep_pct <= 2)} |",
        "",
        "Mean seconds per evaluation and phase (executor's view; `wait_*` = waiting for the GPU's lock):",
        "",
        *[f"- {k}: " + ", ".join(f"{p} {v:.2f}" for p, v in ph.items()) for k, ph in raw["phases_mean_s"].items()],
        "",
        f"All 16 throughput evaluations correct: {all(s == 'correct' for s in statuses)} ({statuses}).",
        "",
        "Memory admission per job (GB; alone: why; retries: the earlier attempts' error class and grant):",
        "",
        "| run | job | budget | need | grant | alone | admission wait s | retries |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {run} | {i} | {_gb(m['budget_bytes'])} | {_gb(m['need_bytes'])} | {_gb(m['grant_bytes'])} | "
          f"{(m['alone_reason'] or 'yes') if m['alone'] else 'no'} | {m['admission_wait_s']} | "
          + (", ".join(f"{a['error_class']} at {_gb(a['grant_bytes'])}" for a in m["retries"]) or "-") + " |"
          for run, mems in (("sequential", raw["sequential_memory"]), ("pool", raw["pool_memory"]))
          for i, m in enumerate(mems)],
        "",
        "Raw numbers:",
        "",
        "```json",
        json.dumps(raw, indent=1, default=str),
        "```",
        "",
    ]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
