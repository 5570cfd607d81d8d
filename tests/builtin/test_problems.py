"""Every bundled problem gets a correct builtin seed at SMALL sizes, judged by the sandbox."""

from __future__ import annotations

from pathlib import Path

import pytest
from kernellab.agents.builtin import build

from kernellab import sandbox
from kernellab.problem import load_problem

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = sorted((ROOT / "experiments" / "problems").rglob("*.py"))


@pytest.mark.slow
@pytest.mark.parametrize("path", PROBLEMS, ids=[f"{p.parent.name}/{p.stem}" for p in PROBLEMS])
def test_seed_is_correct(path):
    problem = load_problem(path)
    code = build(problem)
    assert code.meta["actions"] == []
    # every problem runs at least one generated kernel (scan, gather and pooling have templates now)
    assert code.meta["kernels"] >= 1, code.meta["groups"]
    result = sandbox.evaluate(problem, code.source, small=True, device="cpu", trials=2, timing=False)
    assert result["status"] == "correct", f"{result['status']}: {result['error_text']}"
    assert result["library_only"] is False, result["details"].get("own_kernels")


# the problems whose seeds changed kind or numerics (scan/gather/pool templates, transpose tiles, INNER
# reductions, online softmax, split-K, 3xTF32 by rule): four trials reach the "mixed" distribution
# (magnitudes 1e-3..10), the one that tests a reordered fp32 sum hardest
CHANGED = ["ops/cumsum", "ops/embedding", "ops/maxpool2d", "ops/transpose", "ops/gemm_large_k", "ops/sum_dim",
           "ops/softmax", "ops/log_softmax", "ops/gemm_square", "ops/bmm", "fusions/linear_softmax",
           "fusions/linear_layernorm", "fusions/linear_logsumexp", "fusions/gemm_bias_gelu", "ops/gemm_skinny"]


# the problems of CHANGED are judged at full size below, with one more trial
FULL_ONLY = [p for p in PROBLEMS if f"{p.parent.name}/{p.stem}" not in CHANGED]


@pytest.mark.gpu
@pytest.mark.parametrize("path", FULL_ONLY, ids=[f"{p.parent.name}/{p.stem}" for p in FULL_ONLY])
def test_seed_is_correct_on_gpu_at_full_size(path):
    problem = load_problem(path)
    result = sandbox.evaluate(problem, build(problem).source, small=False, device="cuda", trials=3, timing=False)
    assert result["status"] == "correct", f"{result['status']}: {result['error_text']}"


@pytest.mark.gpu
@pytest.mark.parametrize("name", CHANGED)
def test_changed_seed_on_gpu_with_all_distributions(name):
    problem = load_problem(ROOT / "experiments" / "problems" / f"{name}.py")
    code = build(problem)
    result = sandbox.evaluate(problem, code.source, small=False, device="cuda", trials=4, timing=False)
    trials = result["details"].get("trials", [])
    assert result["status"] == "correct", f"{result['status']}: {result['error_text']} {trials}"
    assert result["library_only"] is False
