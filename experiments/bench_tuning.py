"""Exhaustive grid vs Optuna TPE on two Triton templates: does TPE get within 3% of the grid's best
in at most 25% of the grid's evaluations (median over 11 seeds)? And the grid's wall time vs a study's.

Every number is measured for real on the device: the grid times every config once; each seed's study
times the configs it proposes, again, in its own cold compile cache (a fresh ``TRITON_CACHE_DIR`` and
a fresh ``triton.jit`` object, so compile time counts for the study as it does for the grid).
The study uses the sampler of ``kernellab.search.tune`` (``make_sampler``) and its rules: a config
proposed twice is not re-timed, and a repeat proposal is followed by a random unseen config. Unlike
``tune``, no default CONFIG is enqueued: the search starts from nothing, the harder case.
"Reached" means: the study's incumbent (its own fastest measurement so far) has a *grid* time within
3% of the grid's best, so both sides are judged on one table of measurements.

GPU host (needs torch, triton, optuna; this repository on PYTHONPATH):
    PYTHONPATH=. python experiments/bench_tuning.py                     # both templates, ~8.5 min on H200
(H200, session 7: matmul grid 75 s + about 20 s a seed, softmax 66 s + about 12 s a seed; 5 seeds were too few:
on the matmul grid a seed reaches 3% about 60% of the time, so a 5-seed median fails one time in three)
    PYTHONPATH=. python experiments/bench_tuning.py --template matmul   # or one at a time
writes experiments/results/tuning.md and tuning.json (a run of one template keeps the other's results).
CPU smoke run (interpreter, tiny shapes, 2 choices per parameter; the numbers mean nothing):
    TRITON_INTERPRET=1 PYTHONPATH=. python experiments/bench_tuning.py --smoke --out /tmp/tuning.md
Replay (CPU, no timing): the studies of many seeds on a GPU run's recorded grid, each config's time read from it:
    PYTHONPATH=. python experiments/bench_tuning.py --replay experiments/results/2026-12-01-nvidia-h200-tuning.json \
        --seeds 100 --first-seed 1000
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from itertools import product
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import optuna  # noqa: E402
from kernellab.search._tune import _unseen, canonical_json, make_sampler, parse_space  # noqa: E402

WITHIN = 0.03  # "within 3% of the grid's best"
SHARE = 0.25  # "in at most 25% of the grid's evaluations"


# -- templates (plain functions: each run jit-compiles its own copy, cold) -------------------------
# The loop bounds (K, N) are constexpr: the shapes are fixed per benchmark, and the Triton 3.6
# interpreter with numpy 2.4 cannot run `range()` over a runtime scalar argument (the CPU smoke run).
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K: tl.constexpr, sam, sak, sbk, sbn, scm, scn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_pid_n
    first_m = (pid // per_group) * GROUP_M
    group_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + ((pid % per_group) % group_m)
    pid_n = (pid % per_group) // group_m
    offs_m = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * sam + offs_k[None, :] * sak
    b_ptrs = b_ptr + offs_k[:, None] * sbk + offs_n[None, :] * sbn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_K, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * sak
        b_ptrs += BLOCK_K * sbk
    cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + cm[:, None] * scm + cn[None, :] * scn, acc.to(c_ptr.dtype.element_ty),
             mask=(cm[:, None] < M) & (cn[None, :] < N))


def softmax_kernel(x_ptr, y_ptr, M, N: tl.constexpr, sx, sy, ROWS: tl.constexpr, BLOCK_N: tl.constexpr):
    # ROWS rows per program; two passes over the columns (online max/sum, then normalise and write)
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    m = tl.full((ROWS,), float("-inf"), tl.float32)
    s = tl.zeros((ROWS,), tl.float32)
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * sx + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, 1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new[:, None]), 1)
        m = m_new
    for start in range(0, N, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        mask = rmask[:, None] & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * sx + cols[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        y = tl.exp(x - m[:, None]) / s[:, None]
        tl.store(y_ptr + rows[:, None] * sy + cols[None, :], y.to(y_ptr.dtype.element_ty), mask=mask)


class Template:
    """A kernel, its SPACE, inputs and a reference; ``run(kernel, cfg)`` launches one config."""

    def __init__(self, name: str, fn: Callable, space: dict, shape: str, make: Callable, launch: Callable,
                 reference: Callable, tol: float):
        self.name, self.fn, self.space, self.shape = name, fn, space, shape
        self.make, self.launch, self.reference, self.tol = make, launch, reference, tol


def _matmul(smoke: bool, device: str) -> Template:
    n, dtype = (64, torch.float32) if smoke else (4096, torch.float16)
    space = {"BLOCK_M": [64, 128, 256], "BLOCK_N": [64, 128, 256], "BLOCK_K": [32, 64],
             "num_warps": [4, 8], "num_stages": [3, 4, 5]}

    def make() -> dict:
        g = torch.Generator(device="cpu").manual_seed(0)
        a = torch.randn(n, n, generator=g).to(device, dtype)
        b = torch.randn(n, n, generator=g).to(device, dtype)
        return {"a": a, "b": b, "c": torch.empty(n, n, device=device, dtype=dtype)}

    def launch(kernel: Any, t: dict, cfg: dict) -> torch.Tensor:
        a, b, c = t["a"], t["b"], t["c"]
        grid = (triton.cdiv(n, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
        kernel[grid](a, b, c, n, n, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                     BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], GROUP_M=8,
                     num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
        return c

    return Template("matmul", matmul_kernel, space, f"{n}x{n}x{n} {str(dtype)[6:]}", make, launch,
                    lambda t: t["a"] @ t["b"], tol=1e-2)


def _softmax(smoke: bool, device: str) -> Template:
    m, n = (16, 300) if smoke else (8192, 8192)
    space = {"ROWS": [1, 2, 4, 8], "BLOCK_N": [256, 512, 1024, 2048, 4096], "num_warps": [1, 2, 4, 8, 16]}

    def make() -> dict:
        x = torch.randn(m, n, generator=torch.Generator(device="cpu").manual_seed(0)).to(device)
        return {"x": x, "y": torch.empty_like(x)}

    def launch(kernel: Any, t: dict, cfg: dict) -> torch.Tensor:
        x, y = t["x"], t["y"]
        kernel[(triton.cdiv(m, cfg["ROWS"]),)](x, y, m, n, x.stride(0), y.stride(0), ROWS=cfg["ROWS"],
                                               BLOCK_N=cfg["BLOCK_N"], num_warps=cfg["num_warps"])
        return y

    return Template("softmax", softmax_kernel, space, f"{m}x{n} float32 rows", make, launch,
                    lambda t: torch.softmax(t["x"], dim=-1), tol=1e-5)


# -- measuring -------------------------------------------------------------------------------------
class Bench:
    """Times configs of one template with a cold compile cache of its own."""

    def __init__(self, tpl: Template, warmup_ms: float, rep_ms: float, interpreted: bool):
        self.tpl, self.warmup_ms, self.rep_ms, self.interpreted = tpl, warmup_ms, rep_ms, interpreted
        self.cache = tempfile.mkdtemp(prefix=f"tuning-{tpl.name}-")
        os.environ["TRITON_CACHE_DIR"] = self.cache  # read by Triton at each compile
        self.kernel = triton.jit(tpl.fn)  # a fresh JITFunction: an empty in-memory cache
        self.tensors = tpl.make()
        self.ref = tpl.reference(self.tensors)

    def __call__(self, cfg: dict) -> dict:
        os.environ["TRITON_CACHE_DIR"] = self.cache
        t0 = time.perf_counter()
        try:
            out = self.tpl.launch(self.kernel, self.tensors, cfg)  # the first call compiles
            _sync()
            compile_s = time.perf_counter() - t0
            err = ((out.float() - self.ref.float()).norm() / self.ref.float().norm()).item()
            if not err <= self.tpl.tol:
                return {"status": "incorrect", "reason": f"relative error {err:.2e}", "compile_s": compile_s}
            if self.interpreted:
                t1 = time.perf_counter()
                self.tpl.launch(self.kernel, self.tensors, cfg)
                ms = (time.perf_counter() - t1) * 1e3
            else:
                ms = triton.testing.do_bench(lambda: self.tpl.launch(self.kernel, self.tensors, cfg),
                                             warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median")
        except Exception as exc:  # out of resources, compile errors: the config fails, the search goes on
            _sync(quiet=True)
            return {"status": "fail", "reason": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160]}"
                    if str(exc).strip() else type(exc).__name__, "compile_s": time.perf_counter() - t0}
        return {"status": "ok", "ms": float(ms), "compile_s": compile_s}


def _sync(quiet: bool = False) -> None:
    if torch.cuda.is_available():
        try:
            torch.cuda.synchronize()
        except Exception:
            if not quiet:
                raise


def grid_configs(space: dict) -> list[dict]:
    names = list(space)
    return [dict(zip(names, vals, strict=True)) for vals in product(*(space[n] for n in names))]


def run_grid(tpl: Template, args: argparse.Namespace, interpreted: bool) -> dict:
    bench = Bench(tpl, args.warmup_ms, args.rep_ms, interpreted)
    t0 = time.perf_counter()
    rows = []
    for cfg in grid_configs(tpl.space):
        rows.append({"config": cfg, **bench(cfg)})
    wall = time.perf_counter() - t0
    ok = [r for r in rows if r["status"] == "ok"]
    best = min(ok, key=lambda r: r["ms"])
    return {"configs": len(rows), "failed": len(rows) - len(ok), "wall_s": wall, "best_config": best["config"],
            "best_ms": best["ms"], "compile_s": sum(r["compile_s"] for r in rows), "rows": rows}


def budget_of(grid: dict) -> int:
    """A study's evaluations: 25% of the grid's."""
    return math.ceil(SHARE * grid["configs"])


def run_study(space: dict, bench: Callable[[dict], dict], grid: dict, seed: int, budget: int) -> dict:
    """One seed's TPE study; ``bench(config)`` measures a config (a :class:`Bench`, or a replay of the grid)."""
    table = {canonical_json(r["config"]): r for r in grid["rows"]}
    goal = grid["best_ms"] * (1 + WITHIN)
    dists = parse_space(space)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="minimize", sampler=make_sampler(seed))
    seen: dict[str, Any] = {}
    incumbent, history = None, []
    reached = reached_own = None
    t0 = time.perf_counter()
    asks = 0
    while len(seen) < budget and asks < 50 * budget:
        asks += 1
        trial = study.ask(dists)
        key = canonical_json(trial.params)
        if key in seen:  # as tune(): tell the first outcome again, then try a random unseen config
            r = seen[key]
            study.tell(trial, r["ms"]) if r["status"] == "ok" else study.tell(trial, state=optuna.trial.TrialState.FAIL)
            fresh = _unseen(dists, seen, random.Random(f"{seed}:{len(seen)}:{asks}"))
            if fresh is not None:
                study.enqueue_trial(fresh)
            continue
        r = bench(trial.params)
        seen[key] = r
        if r["status"] == "ok":
            study.tell(trial, r["ms"])
            if incumbent is None or r["ms"] < seen[incumbent]["ms"]:
                incumbent = key
        else:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
        n = len(seen)
        grid_ms = table[incumbent]["ms"] if incumbent and table[incumbent]["status"] == "ok" else math.inf
        if reached is None and grid_ms <= goal:
            reached = {"evals": n, "wall_s": time.perf_counter() - t0}
        if reached_own is None and incumbent and seen[incumbent]["ms"] <= goal:
            reached_own = n
        history.append({"eval": n, "config": trial.params, **r, "incumbent_grid_ms": grid_ms})
    wall = time.perf_counter() - t0
    final = table[incumbent]["ms"] if incumbent else math.inf
    return {"seed": seed, "evals": len(seen), "wall_s": wall, "reached_evals": reached and reached["evals"],
            "reached_wall_s": reached and reached["wall_s"], "reached_own_evals": reached_own,
            "best_config": json.loads(incumbent) if incumbent else None,
            "best_grid_ms": final, "gap": final / grid["best_ms"] - 1, "history": history}


def summarize(grid: dict, studies: list[dict], budget: int) -> dict:
    inf = float("inf")
    evals = [s["reached_evals"] or inf for s in studies]
    med = statistics.median(evals)
    return {"budget": budget, "median_evals_to_3pct": med, "passes": med <= budget,
            "reached": sum(e <= budget for e in evals), "seeds": len(studies),
            "median_gap_at_budget": statistics.median(s["gap"] for s in studies),
            "median_study_wall_s": statistics.median(s["wall_s"] for s in studies),
            "median_wall_s_to_3pct": statistics.median(s["reached_wall_s"] or inf for s in studies),
            "grid_wall_s": grid["wall_s"]}


# -- reporting -------------------------------------------------------------------------------------
def context() -> dict:
    from kernellab import env  # KERNELLAB_COMMIT where the tree is a copy (the GPU host's), else git's HEAD

    try:
        commit = env.git_commit() or ""
    except Exception:
        commit = ""
    return {"device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else f"CPU interpreter ({platform.processor() or platform.machine()})",
            "torch": torch.__version__, "triton": triton.__version__, "optuna": optuna.__version__,
            "python": platform.python_version(), "commit": commit,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def _f(x: float, nd: int = 1) -> str:
    return "not reached" if x is None or x == float("inf") else f"{x:.{nd}f}"


def render(results: dict) -> str:
    out = ["# Tuning: exhaustive grid vs Optuna TPE", "",
           "Produced by `experiments/bench_tuning.py` (see its docstring for the method). All timings are",
           "measured for real: the grid once per config, each study again for every config it proposes,",
           "each in a cold compile cache. \"Reached\" = the study's incumbent has a grid time within 3% of the",
           "grid's best; the goal is a median over the seeds of at most 25% of the grid's evaluations.", ""]
    for name, r in results.items():
        c, g, s = r["context"], r["grid"], r["summary"]
        out += [f"## {name} ({r['shape']})", "",
                f"{c['device']} · torch {c['torch']} · triton {c['triton']} · optuna {c['optuna']} · "
                f"python {c['python']} · commit {c['commit'] or '?'} · {c['date']}"
                + (" · **interpreter smoke run: the numbers mean nothing**" if r.get("smoke") else ""), "",
                f"Space: {', '.join(f'{k} {v}' for k, v in r['space'].items())} = **{g['configs']} configs** "
                f"({g['failed']} fail). Timing: `do_bench` median, warmup {r['warmup_ms']} ms, rep {r['rep_ms']} ms.", "",
                f"Grid: best {g['best_ms']:.4f} ms at `{canonical_json(g['best_config'])}`; wall time "
                f"{g['wall_s']:.1f} s ({g['compile_s']:.1f} s of it compiling).", "",
                "| seed | evals to within 3% | wall s to within 3% | evals (own timing) | gap at budget | study wall s |",
                "|---:|---:|---:|---:|---:|---:|"]
        for st in r["studies"]:
            out.append(f"| {st['seed']} | {_f(st['reached_evals'], 0)} | {_f(st['reached_wall_s'])} | "
                       f"{_f(st['reached_own_evals'], 0)} | {st['gap']:+.1%} | {st['wall_s']:.1f} |")
        planned = r.get("seeds_planned", len(r["studies"]))
        if len(r["studies"]) < planned:
            out += ["", f"**Cut off: {len(r['studies'])} of {planned} seeds finished**; the figures below are over those."]
        if s is None:
            out.append("")
            continue
        verdict = "**yes**" if s["passes"] else "**no**"
        out += ["", f"Budget 25% = {s['budget']} evaluations. Median evaluations to within 3%: "
                f"{_f(s['median_evals_to_3pct'], 0)} ({s['reached']}/{s['seeds']} seeds reached it) -> goal met: {verdict}. "
                f"Median gap to the grid's best at the budget: {s['median_gap_at_budget']:+.1%}.",
                f"Wall time: grid {s['grid_wall_s']:.1f} s; a study of {s['budget']} evaluations "
                f"{s['median_study_wall_s']:.1f} s (median), to within 3% {_f(s['median_wall_s_to_3pct'])} s (median).", ""]
    return "\n".join(out)


def save(results: dict, name: str, tpl: Template, args: argparse.Namespace, grid: dict, studies: list[dict],
         out: Path) -> None:
    """``results[name]`` from the grid and the seeds finished so far, written to ``out`` (.md) and its .json.
    Called after the grid and after each seed: a run cut off by a time limit keeps what it measured."""
    budget = budget_of(grid)
    results[name] = {"context": context(), "shape": tpl.shape, "space": tpl.space, "smoke": args.smoke,
                     "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "grid": grid, "studies": studies,
                     "summary": summarize(grid, studies, budget) if studies else None, "seeds_planned": args.seeds}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    out.write_text(render(results))


def replay(path: Path, seeds: int, first: int) -> None:
    """The studies of ``seeds`` seeds from ``first`` on, each config's time read from a recorded grid
    (a ``tuning.json`` of a GPU run) instead of measured: a sampler's reach over many seeds, on the CPU,
    without timing noise. Prints one line per template; writes nothing."""
    for name, r in json.loads(path.read_text()).items():
        grid = r["grid"]
        table = {canonical_json(row["config"]): row for row in grid["rows"]}
        budget = budget_of(grid)
        studies = [run_study(r["space"], lambda cfg, t=table: t[canonical_json(cfg)], grid, seed, budget)
                   for seed in range(first, first + seeds)]
        s = summarize(grid, studies, budget)
        near = sum(1 for row in grid["rows"] if row["status"] == "ok" and row["ms"] <= grid["best_ms"] * (1 + WITHIN))
        print(f"{name}: {near} of {grid['configs']} configs within 3% of the best; seeds {first}-{first + seeds - 1}: "
              f"{s['reached']}/{seeds} reached it within {budget} evaluations, median "
              f"{_f(s['median_evals_to_3pct'], 1)}, median gap at the budget {s['median_gap_at_budget']:+.1%}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--template", choices=["matmul", "softmax", "both"], default="both")
    ap.add_argument("--seeds", type=int, default=11)
    ap.add_argument("--warmup-ms", type=float, default=5.0)
    ap.add_argument("--rep-ms", type=float, default=20.0)
    ap.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, 2 choices per parameter")
    ap.add_argument("--out", default=str(ROOT / "experiments" / "results" / "tuning.md"))
    ap.add_argument("--replay", type=Path, default=None, metavar="JSON",
                    help="no GPU: replay the studies on a recorded grid (a GPU run's tuning.json), --seeds of them")
    ap.add_argument("--first-seed", type=int, default=0, help="with --replay: the first seed")
    args = ap.parse_args()
    if args.replay:
        replay(args.replay, args.seeds, args.first_seed)
        return
    from kernellab import _runtime

    _runtime.setup()  # an entry point: without a CUDA device its kernels run in the interpreter, as the CLI's do
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpreted and not torch.cuda.is_available():
        sys.exit("no CUDA device: run on the GPU host, or with TRITON_INTERPRET=1 --smoke")
    device = "cpu" if interpreted else "cuda"
    out = Path(args.out)
    json_path = out.with_suffix(".json")
    results = json.loads(json_path.read_text()) if json_path.exists() else {}
    names = ["matmul", "softmax"] if args.template == "both" else [args.template]
    for name in names:
        tpl = (_matmul if name == "matmul" else _softmax)(args.smoke, device)
        if args.smoke:
            tpl.space = {k: v[:2] for k, v in tpl.space.items()}
        grid = run_grid(tpl, args, interpreted)
        budget = budget_of(grid)
        print(f"{name}: grid {grid['configs']} configs, best {grid['best_ms']:.4f} ms, {grid['wall_s']:.1f} s",
              flush=True)
        studies: list[dict] = []
        save(results, name, tpl, args, grid, studies, out)
        for seed in range(args.seeds):
            st = run_study(tpl.space, Bench(tpl, args.warmup_ms, args.rep_ms, interpreted), grid, seed, budget)
            studies.append(st)
            print(f"  seed {seed}: within 3% after {st['reached_evals']} evals, gap at budget {st['gap']:+.1%}, "
                  f"{st['wall_s']:.1f} s", flush=True)
            save(results, name, tpl, args, grid, studies, out)
        summary = summarize(grid, studies, budget)
        print(f"  median evals to within 3%: {summary['median_evals_to_3pct']} of budget {budget} -> "
              f"{'PASS' if summary['passes'] else 'FAIL'}; grid {grid['wall_s']:.1f} s vs study "
              f"{summary['median_study_wall_s']:.1f} s", flush=True)
    print(f"wrote {out} and {json_path}")


if __name__ == "__main__":
    main()
