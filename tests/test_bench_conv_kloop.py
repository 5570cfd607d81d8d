"""experiments/bench_conv_kloop.py: its three sides are the K orders they claim to be, and all are correct, judged by
the sandbox in the interpreter (the CPU's smoke run: the ieee child; the GPU runs the tf32rn one)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("bench_conv_kloop", ROOT / "experiments" / "bench_conv_kloop.py")
kloop = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kloop)

PROBLEM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 0.5


def get_inputs():
    return [torch.randn(2, 16, 6, 5)]


def get_init_inputs():
    return []
"""


def test_sides_are_their_k_orders_and_all_correct(tmp_path):
    f = tmp_path / "tconv16.py"
    f.write_text(PROBLEM)
    new = kloop.child_source(f, ROOT, "ieee")
    flat = kloop.child_source(f, ROOT, "ieee", TAP_MAJOR=0)
    nchw = kloop.child_source(f, ROOT, "ieee", NHWC=0)
    assert "'TAP_MAJOR': 1" in new and "'TAP_MAJOR': 0" in flat and 'input_precision="ieee"' in new
    assert "'NHWC': 1" in new and "'NHWC': 0" in nchw and "'TAP_MAJOR': 1" in nchw
    assert kloop.main(["--make-base", str(tmp_path / "base"), "--base", "HEAD", str(f)]) == 0
    assert {p.name for p in (tmp_path / "base").iterdir()} == {"tconv16.tf32rn.py", "tconv16.ieee.py"}
    out = tmp_path / "out"
    assert kloop.main(["--small", "--base-dir", str(tmp_path / "base"), str(f), "--out-dir", str(out)]) == 0
    (js,) = out.glob("*-conv-kloop.json")
    (row,) = json.loads(js.read_text())["rows"]
    assert [r["status"] for s in kloop.DEFAULT_SIDES for r in row[s]] == ["correct"] * 8, row
    assert row["seed"]["status"] == "correct"


def test_bad_input_is_one_line(tmp_path, capsys):
    f = tmp_path / "tconv16.py"
    f.write_text(PROBLEM)
    assert kloop.main(["--small", str(f)]) == 2
    assert kloop.main(["--small", "--base-dir", str(tmp_path), str(f)]) == 2
    assert kloop.main(["--small", "--base-dir", str(tmp_path), str(tmp_path / "none.py")]) == 2
    assert kloop.main(["--small", "--sides", "flat,new", str(f)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(e.startswith("bench_conv_kloop: ") for e in err), err
    assert "--make-base" in err[0] and "no base source" in err[1] and "no problem file" in err[2] and "new first" in err[3]


def test_sides_without_base_need_no_base_dir(tmp_path):
    f = tmp_path / "tconv16.py"
    f.write_text(PROBLEM)
    out = tmp_path / "out"
    assert kloop.main(["--small", "--sides", "new,w4", "--precision", "tf32x3", str(f), "--out-dir", str(out)]) == 0
    (md,) = out.glob("*-conv-kloop.md")
    assert "| problem | new ms | w4 ms | w4 / new |" in md.read_text() and "The builtin tf32x3 child" in md.read_text()
    (js,) = out.glob("*-conv-kloop.json")
    (row,) = json.loads(js.read_text())["rows"]
    assert [r["status"] for s in ("new", "w4") for r in row[s]] == ["correct"] * 4, row
