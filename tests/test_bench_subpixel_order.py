"""experiments/bench_subpixel_order.py: the phase-major source it compares against is the grid of before (the
phase read from program_id(2)) and still a correct kernel, judged by the sandbox in the interpreter."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from kernellab.agents.builtin import build
from kernellab.problem import load_problem

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_subpixel_order", ROOT / "experiments" / "bench_subpixel_order.py")
order = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(order)

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.ConvTranspose2d(4, 16, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x):
        return torch.clamp(self.conv(x), -0.3, 0.3) / 2.0


def get_inputs():
    return [torch.randn(2, 4, 5, 4)]


def get_init_inputs():
    return []
"""


def _file(tmp_path: Path, text: str = PROBLEM) -> Path:
    f = tmp_path / "tconv.py"
    f.write_text(text)
    return f


def test_the_old_grid_is_phase_major_and_both_sides_are_correct(tmp_path):
    new = build(load_problem(_file(tmp_path))).source
    old = order.phase_major(new)
    assert "cls = tl.program_id(2)" in old and "pid = pid // (SD * SH * SW)" not in old
    assert "triton.cdiv(cout_g, bn), groups, 4)" in old and "tl.program_id(2)" not in new
    out = tmp_path / "out"
    assert order.main(["--small", str(_file(tmp_path)), "--out-dir", str(out)]) == 0
    (js,) = out.glob("*-subpixel-order.json")
    (row,) = json.loads(js.read_text())["rows"]
    assert [r["status"] for r in row["new"] + row["old"]] == ["correct"] * 4, row


def test_a_conv_without_phases_is_one_line(tmp_path, capsys):
    plain = PROBLEM.replace("ConvTranspose2d(4, 16, 3, stride=2, padding=1, output_padding=1)", "Conv2d(4, 16, 3)")
    with pytest.raises(order.OrderError, match="no sub-pixel"):
        order.phase_major(build(load_problem(_file(tmp_path, plain))).source)
    assert order.main(["--small", str(_file(tmp_path, plain)), "--out-dir", str(tmp_path)]) == 2
    assert order.main(["--small", str(tmp_path / "none.py")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-2].startswith("bench_subpixel_order: no sub-pixel") and err[-1].startswith("bench_subpixel_order: no problem file")
