"""A trial whose reference a null output (zeros, a constant) would pass judges nothing (issue 34): the
derived small instance keeps the problem's structure until its reference is informative, and the
sandbox refuses, as the problem's fault, a problem whose every trial is uninformative."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernellab.problem import Problem, load_problem
from kernellab.sandbox import evaluate
from kernellab.sandbox._check import null_output, null_verdicts, uninformative
from kernellab.small import small_overrides

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# ../shared/kernelbench beside the checkout, or KERNELBENCH_DIR
KB_DIR = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
ONE_CHANNEL = HERE / "problems" / "one_channel_groups.py"
# KernelBench's GroupNorm problems the issue names: (file, the constant of the groups, of the channels)
GROUPNORM = [("30_Gemm_GroupNorm_Hardtanh", "num_groups", "out_features"),
             ("62_Matmul_GroupNorm_LeakyReLU_Sum", "num_groups", "hidden_size"),
             ("88_Gemm_GroupNorm_Swish_Multiply_Swish", "num_groups", "out_features"),
             ("94_Gemm_BiasAdd_Hardtanh_Mish_GroupNorm", "num_groups", "out_features")]
# Returns zeros of the reference's shape (batch, features): the second constructor argument is the
# output width in all four problems.
ZEROS = '''import torch


class ModelNew(torch.nn.Module):
    def __init__(self, in_features, out_features, *args):
        super().__init__()
        self.out_features = out_features

    def forward(self, x):
        return torch.zeros(x.shape[0], self.out_features, dtype=x.dtype, device=x.device)
'''
SAME_AS_REFERENCE = '''import torch


class ModelNew(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.norm = torch.nn.GroupNorm(channels, channels)

    def forward(self, x):
        return self.norm(x)
'''
needs_kb = pytest.mark.skipif(not KB_DIR.is_dir(), reason=f"KernelBench not found at {KB_DIR}")


def test_null_outputs_named() -> None:
    noise = torch.full((64,), 7e-6)
    assert null_output(noise, 1e-4, 1e-4) == "zeros"
    assert null_output(torch.ones(64), 1e-4, 1e-4) == "the constant 1"
    assert null_output(torch.randn(64), 1e-4, 1e-4) is None
    assert null_output(torch.tensor(0.5), 1e-4, 1e-4) is None  # one element: any value is "a constant"
    assert null_output(torch.tensor([float("nan"), 0.0]), 1e-4, 1e-4) is None  # NaN must be matched


def test_constant_fixed_across_trials() -> None:
    # a loss (one element) that changes with the inputs is informative; a constant output is not
    losses = [[torch.tensor(v)] for v in (0.3, 0.7, 1.1)]
    assert uninformative(null_verdicts(losses, [1e-4] * 3, 1e-4), 1e-4, 1e-4) is None
    broadcast = [[torch.full((16,), v)] for v in (0.3, 0.7, 1.1)]  # computed from the inputs: not null
    assert uninformative(null_verdicts(broadcast, [1e-4] * 3, 1e-4), 1e-4, 1e-4) is None
    ones = [[torch.ones(16)] for _ in range(3)]
    assert "the constant 1" in uninformative(null_verdicts(ones, [1e-4] * 3, 1e-4), 1e-4, 1e-4)
    # one informative output is enough: a null ModelNew is null in every output
    two = [[torch.zeros(16), torch.randn(16)] for _ in range(3)]
    assert uninformative(null_verdicts(two, [1e-4] * 3, 1e-4), 1e-4, 1e-4) is None


@needs_kb
@pytest.mark.parametrize("name, groups, channels", GROUPNORM)
def test_all_zeros_is_not_correct_at_the_derived_size(sandbox_executor, name: str, groups: str,
                                                      channels: str) -> None:
    p = load_problem(KB_DIR / "level2" / f"{name}.py")
    over = small_overrides(p)
    assert over[channels] > over[groups], over  # channels per group above 1: the problem's structure kept
    r = evaluate(p, ZEROS, trials=5, timing=False, device="cpu", executor=sandbox_executor)
    assert r["status"] == "incorrect", (r["status"], r["error_text"])
    assert r["details"]["instance"]["sizes"] == over


@needs_kb
@pytest.mark.parametrize("name, groups, channels", GROUPNORM)
def test_all_zeros_is_not_correct_at_kernelbench_size(sandbox_executor, name: str, groups: str, channels: str) -> None:
    """The size a GPU judges at (1024 x 8192, 16-512 groups), judged here by the same sandbox on the CPU
    (the zeros candidate runs no kernel; the reference's GEMM takes ~10 s on two cores)."""
    p = load_problem(KB_DIR / "level2" / f"{name}.py")
    r = evaluate(p, ZEROS, small=False, trials=5, timing=False, device="cpu", executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("incorrect", "mismatch"), (r["status"], r["error_text"])


@needs_kb
def test_all_zeros_on_level2_30_at_its_old_derived_size_is_the_problems_fault(sandbox_executor) -> None:
    # the instance derived before issue 34, one channel per group: zeros were `correct`, exit 0
    src = (KB_DIR / "level2" / "30_Gemm_GroupNorm_Hardtanh.py").read_text()
    p = Problem("kb30_one_channel", src + "\nSMALL = {'batch_size': 8, 'in_features': 8, 'out_features': 8, "
                                          "'num_groups': 8}\n")
    r = evaluate(p, ZEROS, trials=5, timing=False, device="cpu", executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("runtime_error", "problem"), r["error_text"]
    assert "uninformative" in r["error_text"] and "num_groups=8" in r["error_text"]
    assert [t["informative"] for t in r["details"]["trials"]] == [False] * 5


@pytest.mark.parametrize("small", [True, False])
def test_a_problem_uninformative_at_any_size_is_refused(sandbox_executor, small: bool) -> None:
    # a right candidate too: the problem cannot tell it from zeros, at its small size or its full one
    r = evaluate(load_problem(ONE_CHANNEL), SAME_AS_REFERENCE, trials=3, timing=False, device="cpu", small=small,
                 executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("runtime_error", "problem"), r["error_text"]
    assert "a null output passes every trial (4; output 0: zeros" in r["error_text"]
    assert r["details"]["trials"][0]["null_output"] == "output 0: zeros"


def test_informative_trials_are_recorded(sandbox_executor) -> None:
    # one informative trial is enough; each row says whether it was
    p = Problem("relu_mixed", '''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x - 1.0)  # zeros on inputs below 1 (problem, uniform); not on large, mixed


def get_inputs():
    return [torch.rand(4, 8)]


def get_init_inputs():
    return []
''')
    src = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.relu(x - 1.0)\n"
    r = evaluate(p, src, trials=4, timing=False, device="cpu", small=False, executor=sandbox_executor)
    assert r["status"] == "correct", r["error_text"]
    assert [t["informative"] for t in r["details"]["trials"]] == [False, False, True, True]


def test_eval_of_an_uninformative_problem_is_one_line_exit_2(tmp_path: Path) -> None:
    cand = tmp_path / "cand.py"
    cand.write_text(SAME_AS_REFERENCE)
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "eval", str(ONE_CHANNEL), str(cand), "--no-timing",
                        "--trials", "2"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "uninformative" in lines[0], r.stderr


def test_run_of_an_uninformative_problem_is_one_line_exit_2_nothing_written(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "run", str(ONE_CHANNEL), "--device", "cpu"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "uninformative" in lines[0] and "(small instance" in lines[0], r.stderr
    assert not list(tmp_path.iterdir())


# zero on the problem's own inputs and on the uniform ones (ReLU far above them), not on the large ones
SHIFTED_RELU = Problem(name="shifted_relu", source='''import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x - 6.0)


def get_inputs():
    return [torch.randn(8, 127)]


def get_init_inputs():
    return []
''')


def test_a_job_of_two_trials_a_null_output_passes_gets_an_informative_one(sandbox_executor) -> None:
    zeros = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return torch.zeros_like(x)\n"
    right = "import torch\n\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return (x - 6.0).clamp_min(0.0)\n"
    bad = evaluate(SHIFTED_RELU, zeros, trials=2, timing=False, device="cpu", executor=sandbox_executor)
    # judged on the informative trial: not correct (zeros again there read as an earlier trial's output), and
    # not refused as the problem's fault either
    assert bad["status"] in ("incorrect", "rejected") and bad["error_class"] != "problem", bad["error_text"]
    good = evaluate(SHIFTED_RELU, right, trials=2, timing=False, device="cpu", executor=sandbox_executor)
    assert good["status"] == "correct", good["error_text"]  # not refused as the problem's fault
    assert good["details"]["reference"].get("extra_trials", 0) >= 1
    assert [t["informative"] for t in good["details"]["trials"]][-1] is True
