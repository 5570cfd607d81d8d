"""A campaign built through the real store API, with real candidate sources, for the report tests."""

from __future__ import annotations

from pathlib import Path

from kernellab import load_problem
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = [ROOT / "tests/export/linear_relu.py", ROOT / "experiments/problems/fusions/gemm_bias_gelu.py"]
SOURCE = (ROOT / "tests/export/candidate_self_contained.py").read_text()
EAGER_MS, COMPILE_MS = 2.0, 1.6


def timed(ms: float, interpreted: bool, **kw) -> dict:
    """A correct, timed evaluation; speedups are derived from the times as the sandbox does.
    Interpreted rows carry speedups too, so that the report is tested to hide them."""
    return {"status": "correct", "median_ms": ms, "p20_ms": ms * 0.9, "p80_ms": ms * 1.2, "eager_ms": EAGER_MS,
            "compile_ms": COMPILE_MS, "speedup_eager": EAGER_MS / ms, "speedup_compile": COMPILE_MS / ms,
            "interpreted": interpreted, "device": "cpu (interpreter)" if interpreted else "NVIDIA H200",
            "own_kernel_share": 0.8, **kw}


def build_campaign(store: Store, name: str = "demo", interpreted: bool = False, metrics: str = "full") -> str:
    """Two problems; per problem a seed, failing children (compile error, incorrect, rejected, timeout),
    a better child, a tuned grandchild (trials + retime), a profile with ``metrics`` ("full": FLOPs,
    bytes and time; "bandwidth": bytes and time; "ncu": the sandbox's ncu names; "none"), analyst events and LLM calls."""
    cid = store.create_campaign(name, {"budget": 8, "policy": "greedy"}, "cpu" if interpreted else "NVIDIA H200",
                                {"torch": "2.11", "triton": "3.6"})
    for k, path in enumerate(PROBLEMS):
        pid = store.add_problem(load_problem(path, validate_run=False))
        src = SOURCE + f"\n# problem {k}\n"
        seed = store.add_candidate(cid, pid, src, origin="seed", action="fused Triton baseline")
        store.add_evaluation(seed, timed(1.8 + k, interpreted))
        store.add_event(cid, "analyze", {"candidate_id": seed, "bound": "memory", "pct_of_ceiling": 41.5,
                                         "evidence": f"seed of problem {k} streams the output twice",
                                         "next_ideas": ["fuse the epilogue", "larger tiles"]})
        fails = [("compile_error", "triton.CompilationError: at 12:4: unsupported op"),
                 ("incorrect", "max abs err 0.31 at index (0, 5)"), ("rejected", "output aliases an input"),
                 ("timeout", "timed out after 60 s")]
        for j, (status, err) in enumerate(fails):
            c = store.add_candidate(cid, pid, src + f"# failing variant {j}\n", parent_id=seed, origin="llm",
                                    model="claude-test", action=f"attempt {status}")
            store.add_evaluation(c, {"status": status, "error_text": err, "error_class": status.split("_")[0],
                                     "interpreted": interpreted, "device": "x"})
        better = store.add_candidate(cid, pid, src + "# fuse epilogue\n", parent_id=seed, action="fuse the epilogue")
        store.add_evaluation(better, timed(1.1 + k, interpreted))
        tuned = store.add_candidate(cid, pid, src + "# tile 128\n", parent_id=better, action="tile 128",
                                    space={"BLOCK": [64, 128, 256]})
        store.add_evaluation(tuned, timed(0.9 + k, interpreted, config={"BLOCK": 1024}))
        for b, ms in ((64, 1.3), (128, 0.8), (256, 0.95)):
            store.add_evaluation(tuned, timed(ms + k, interpreted, config={"BLOCK": b}), kind="trial")
        best_eval = store.add_evaluation(tuned, timed(0.7 + k, interpreted, config={"BLOCK": 128}), kind="retime")
        store.add_event(cid, "analyze", {"candidate_id": tuned, "bound": "compute", "pct_of_ceiling": 73.0,
                                         "evidence": f"problem {k}: tensor cores busy 73%", "next_ideas": ["split-K"]})
        if metrics == "ncu" and not interpreted:
            # the names the sandbox's ncu profile writes (kernellab/sandbox/_profile.py), derived rates included
            rows = []
            for kern, ns, rd, wr, fma in (("gemm_kernel", 480_000.0, 6.0e6, 3.0e6, 4.0e9), ("relu_kernel", 2_000.0, 2.0e6, 1.0e6, 0.0)):
                rows += [(kern, "duration_ns", ns), (kern, "dram_bytes_read", rd), (kern, "dram_bytes_write", wr),
                         (kern, "fp32_fma_thread_ops", fma), (kern, "fp32_add_thread_ops", 1.0e6),
                         (kern, "achieved_bandwidth_tbs", (rd + wr) / ns / 1e3), (kern, "sm_throughput_pct", 55.0)]
            store.add_evaluation(tuned, {"status": "correct", "config": {"BLOCK": 128}, "device": "NVIDIA H200"},
                                 kind="profile", metrics=rows)
        if metrics == "none":
            store.add_event(cid, "profile", {"candidate_id": tuned, "metrics": 0,
                                             "skipped": "ncu (Nsight Compute) was not found on PATH"})
        if metrics in ("full", "bandwidth") and not interpreted:
            rows = [("relu_kernel", "dram_bytes", 3.0e6 * (k + 1)), ("relu_kernel", "duration_ms", 0.002),
                    ("gemm_kernel", "dram_bytes", 9.0e6), ("gemm_kernel", "duration_ms", 0.5)]
            if metrics == "full":
                rows += [("relu_kernel", "flop_count", 1.0e6), ("gemm_kernel", "flop_count", 1.0e10)]
            store.add_evaluation(tuned, {"status": "correct", "config": {"BLOCK": 128}, "device": "NVIDIA H200"},
                                 kind="profile", metrics=rows)
        assert best_eval
    for role, model, tin, tout, cost in (("planner", "claude-test", 1200, 300, 0.0123),
                                         ("coder", "claude-test", 2500, 1800, 0.0456),
                                         ("coder", "qwen-local", 2000, 1500, 0.0)):
        store.add_llm_call({"campaign_id": cid, "role": role, "model": model, "input_tokens": tin,
                            "output_tokens": tout, "cost_usd": cost, "latency_s": 1.5})
    return cid
