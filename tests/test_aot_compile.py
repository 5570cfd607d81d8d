"""experiments/aot_compile.py: the conv kernels compiled for sm_90 without a GPU, at KernelBench's sizes (with ptxas's register count), and the
error the interpreter never sees (a loop-carried value whose type changes) reported. In a subprocess: the
tests run under the Triton interpreter, which makes ``triton.jit`` return functions that cannot be compiled."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KB = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
PADDED = KB / "level1" / "80_conv_standard_2D_square_input_asymmetric_kernel___dilated____padded__.py"
TRANSPOSED = KB / "level2" / "10_ConvTranspose2d_MaxPool_Hardtanh_Mean_Tanh.py"

SCRIPT = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, "experiments")
import aot_compile as A
from kernellab.agents.builtin import Precision, SetConfig, build, built
from kernellab.problem import load_problem

out = {}
for path in sys.argv[1:]:
    p = load_problem(Path(path), validate_run=False)
    g = [x for x in built(p).groups if x.kind == "conv"][0]
    for tap in (1, 0):
        src = build(p, [Precision(g.id, "tf32rn"), SetConfig(g.id, (("TAP_MAJOR", tap),), "order")]).source
        if tap == 0 and "q = ih0" in src:
            # the flat loop with a name the pixel decode set before it, re-used for a 2-D bound: the type changes
            broken = src.replace("q = ih0[:, None]", "t = ih0[:, None]").replace("(q >= 0) & (q < IH)", "(t >= 0) & (t < IH)")
            out[f"{p.name}:broken"] = [r for r in A.compile_all(p, broken) if "conv" in r["kernel"]]
        out[f"{p.name}:{tap}"] = [r for r in A.compile_all(p, src) if "conv" in r["kernel"]]
    w4 = build(p, [Precision(g.id, "tf32rn"), SetConfig(g.id, (("num_warps", 4),), "a warpgroup")]).source
    out[f"{p.name}:w4"] = [r for r in A.compile_all(p, w4) if "conv" in r["kernel"]]
print(json.dumps(out))
"""


@pytest.mark.skipif(not PADDED.is_file(), reason="KernelBench is not beside the checkout")
def test_tf32rn_convs_compile_for_sm90_in_both_k_orders_and_a_type_change_is_caught():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(PADDED), str(TRANSPOSED)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in (PADDED.stem, TRANSPOSED.stem):
        for tap in (1, 0):
            rows = got[f"{name}:{tap}"]
            assert len(rows) == 1 and "error" not in rows[0], rows
            r = rows[0]
            # the launch asked for the order, and the GPU's rounding instruction and a tensor-core MMA are in the PTX (at
            # the own conv's default two warps an mma.sync: Hopper's wgmma takes a warpgroup of four)
            assert r["constexprs"]["TAP_MAJOR"] is bool(tap) and r["constexprs"]["TF32RN"] is True, r
            assert r["cvt_rna"] and (r["wgmma"] or r["mma_sync"]), r
        (w4,) = got[f"{name}:w4"]
        assert "error" not in w4 and w4["wgmma"], w4  # four warps: Hopper's wgmma
        # ptxas's own count: a tf32rn conv at 64x128 on four warps holds its 64 accumulators a thread without spilling
        assert 64 < w4["regs"] <= 255 and w4["spill_stores"] == 0 and w4["spill_loads"] == 0, w4
    broken = got[f"{PADDED.stem}:broken"]
    assert len(broken) == 1 and "Loop-carried variable t" in broken[0].get("error", ""), broken


def test_bad_input_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "experiments/aot_compile.py", str(tmp_path / "none.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "no problem file" in proc.stderr
