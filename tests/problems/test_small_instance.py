"""The small instance a problem runs at on the CPU: SMALL, or derived from the file's size constants,
always by re-executing the source (derived constants follow); refused in seconds when there is none."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernellab.campaign import CampaignConfig, check_campaign
from kernellab.problem import ProblemError, load_problem
from kernellab.small import shrink, size_constants, small_overrides

HERE = Path(__file__).resolve().parent
KB_GEMM = HERE / "kb_gemm_add_relu.py"  # KernelBench level 2 no. 76, unmodified: no SMALL, 1024x8192x8192
HUGE = HERE / "kb_huge_no_constants.py"


def test_small_recomputes_derived_constants() -> None:
    # setting the globals after import (the old way) left bias_shape at (128, 1, 1)
    p = load_problem(HERE / "small_derived_constant.py")
    mod = p.module(small=True)
    assert (mod.batch_size, mod.out_channels) == (2, 4)
    assert mod.bias_shape == (4, 1, 1)
    assert p.module().bias_shape == (128, 1, 1)  # the full instance is untouched


def test_file_without_small_gets_a_derived_instance_in_seconds() -> None:
    t0 = time.monotonic()
    p = load_problem(KB_GEMM)
    over = small_overrides(p)
    assert time.monotonic() - t0 < 30
    assert over == {"batch_size": 8, "in_features": 8, "out_features": 8}
    mod = p.module(small=True)
    assert mod.bias_shape == (8,)  # derived from out_features, re-executed
    assert list(mod.get_inputs()[0].shape) == [8, 8]


def test_shrink_keeps_divisibility_and_equal_sizes() -> None:
    consts = {"batch_size": 128, "channels": 96, "groups": 6, "height": 256, "width": 256, "kernel_size": 3}
    over = shrink(consts, 8)
    assert over["channels"] % 6 == 0 and over["channels"] <= 8  # GroupNorm(groups, channels) stays valid
    assert over["height"] == over["width"]
    assert "kernel_size" not in over and "groups" not in over
    assert size_constants("H, W = 32, 64\nN = M = 128\nATOL = 1\nflag = True\n") == {"H": 32, "W": 64, "N": 128, "M": 128}


def test_cpu_campaign_refuses_a_problem_without_usable_small_instance() -> None:
    t0 = time.monotonic()
    p = load_problem(HUGE)  # checked at full size on the meta device: nothing allocated
    with pytest.raises(ProblemError, match="no small instance usable on the CPU"):
        check_campaign(CampaignConfig(problems=[str(HUGE)], device="cpu"), problems=[p])
    assert time.monotonic() - t0 < 30


def test_cli_refusal_is_one_line_exit_2(tmp_path: Path) -> None:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "run", str(HUGE), "--device", "cpu"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no small instance usable on the CPU" in lines[0], r.stderr
    assert time.monotonic() - t0 < 60
    assert not list(tmp_path.iterdir())


ARITH_TUPLE = '''import torch

M = 1024 * 2
N = 2 ** 11
batch_size = 32768
input_shape = (32768,)
kernel_size = (3, 5)
dim = 1


class Model(torch.nn.Module):
    def forward(self, a, b, x):
        return torch.matmul(a, b).sum() + x.sum()


def get_inputs():
    return [torch.rand(M, N), torch.rand(N, M), torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return []
'''


def test_sizes_written_as_arithmetic_or_tuples_are_shrunk() -> None:
    # KernelBench writes M = 1024 * 2 (11 matmul problems) and input_shape = (32768,) (losses): before,
    # only literal ints counted and these problems had no small instance; an all-small tuple is a window
    # parameter (kernel_size) and stays out, as its items would constrain the sizes' divisors
    assert size_constants(ARITH_TUPLE) == {"M": 2048, "N": 2048, "batch_size": 32768, "input_shape": (32768,),
                                           "dim": 1}
    assert size_constants("a = 2 * x\nb = (4, n)\nc = 3.0 * 2\nd = -4 + 2\ne = 10 ** 100\n") == {}
    from kernellab.problem import Problem

    p = Problem("arith_tuple", ARITH_TUPLE)
    over = small_overrides(p)
    assert over == {"M": 8, "N": 8, "batch_size": 8, "input_shape": (8,)}
    a, b, x = p.module(small=True).get_inputs()
    assert a.shape == (8, 8) and b.shape == (8, 8) and x.shape == (8, 8)


def test_strict_shrink_keeps_proper_multiples() -> None:
    # KernelBench level2/30: 8192 channels in 16 groups; capped at 8 both became 8, one channel per group
    consts = {"batch_size": 1024, "in_features": 8192, "out_features": 8192, "num_groups": 16}
    assert shrink(consts, 8) == {"batch_size": 8, "in_features": 8, "out_features": 8, "num_groups": 8}
    strict = shrink(consts, 8, strict=True)
    assert strict["out_features"] > strict["num_groups"] and strict["out_features"] % strict["num_groups"] == 0
    assert strict["in_features"] == strict["out_features"]


def test_derived_instance_is_informative_where_one_is() -> None:
    # level2/76's reference is informative at cap 8: its instance is the one it always was
    p = load_problem(KB_GEMM)
    from kernellab.small import small_fault

    assert small_fault(p, 5) is None
    assert small_overrides(p) == {"batch_size": 8, "in_features": 8, "out_features": 8}


RETURNS_LIST = HERE / "returns_list.py"


def test_forward_returning_a_list_is_the_problems_fault_at_any_size() -> None:
    # before: "no small instance usable on the CPU ... add SMALL", which blamed the sizes
    with pytest.raises(ProblemError, match=r"Model.forward returned list, not a tensor or a tuple of tensors$"):
        load_problem(RETURNS_LIST)


@pytest.mark.parametrize("command", ["run", "eval"])
def test_bad_problem_is_exit_2_with_the_true_reason(tmp_path: Path, command: str) -> None:
    cand = HERE / "small_derived_constant.py"  # any file: the problem is refused before it is read
    args = ["run", str(RETURNS_LIST), "--device", "cpu"] if command == "run" else ["eval", str(RETURNS_LIST), str(cand)]
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", *args], capture_output=True, text=True, cwd=tmp_path,
                       timeout=300)
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Model.forward returned list, not a tensor" in lines[0], r.stderr
    assert not list(tmp_path.iterdir())


def test_eval_trials_0_is_one_line_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "eval", str(KB_GEMM), str(KB_GEMM), "--trials", "0"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--trials must be at least 1" in lines[0], r.stderr
    assert not list(tmp_path.iterdir())
