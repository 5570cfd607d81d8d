"""The problem's floor (``cost.floor_seconds``), which the campaign's roofline stop divides by the best's time:
what it counts, and where it declines to count (None) rather than set a floor too high."""

from __future__ import annotations

import pytest

from kernellab.compiler import capture
from kernellab.compiler.cost import CEILING_BW, floor_seconds, peak_flops
from kernellab.problem import Problem


def problem(forward: str, inputs: str, init: str = "", extra: str = "") -> Problem:
    src = (f"import torch\n\nclass Model(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
           f"        {init or 'pass'}\n\n    def forward(self, x, y):\n        {forward}\n\n"
           f"def get_inputs():\n    return [{inputs}]\n\ndef get_init_inputs():\n    return []\n{extra}")
    return Problem(name="floor", source=src, path="floor.py")


def floor(forward: str, inputs: str = "torch.randn(256, 1024), torch.randn(256, 1024)", init: str = "") -> float | None:
    return floor_seconds(capture(problem(forward, inputs, init)))


def test_an_elementwise_problem_moves_its_input_and_output_once():
    # y is an input the forward never reads: no implementation has to move it
    assert floor("return torch.sigmoid(x) * 2") == pytest.approx(2 * 256 * 1024 * 4 / CEILING_BW)
    assert floor("return torch.relu(x) + y") == pytest.approx(3 * 256 * 1024 * 4 / CEILING_BW)
    # a reduction writes little: the read is the floor, and fusing cannot lower it
    assert floor("return (x * y).sum(dim=1)") == pytest.approx((2 * 256 * 1024 + 256) * 4 / CEILING_BW)


def test_a_gemm_is_bounded_by_its_flops_at_the_fastest_measured_rate():
    # fp32 at TF32's rate: cuDNN's default convolutions and our tf32 kernels run there
    got = floor("return x @ y", "torch.randn(2048, 2048), torch.randn(2048, 2048)")
    assert got == pytest.approx(2 * 2048 ** 3 / peak_flops("float32", True))
    assert got > 3 * 2048 * 2048 * 4 / CEILING_BW


def test_an_op_left_to_pytorch_reads_its_input_whole():
    # argmax stays ATen (opaque): the floor still reads x once and writes 256 int64 indices
    assert floor("return torch.argmax(x, dim=1)") == pytest.approx((256 * 1024 * 4 + 256 * 8) / CEILING_BW)


def test_no_floor_where_an_input_may_be_read_in_part():
    # a view that selects part of its source reads less than the whole input
    assert floor("return torch.relu(x[:, :8])") is None
    # a gather reads the rows it picks; zeros_like reads only a shape
    assert floor("return torch.gather(x, 1, y)", "torch.randn(256, 1024), torch.randint(0, 1024, (256, 4))") is None
    assert floor("return torch.zeros_like(x) + y") is None
