"""experiments/kb_coverage.py on two KernelBench files and a flip in KernelBench's format (CPU): the real capture,
partition and codegen classify a ReLU and a conv block (on the CPU our conv with its epilogue) as all-own and a
flip as library-only (no KernelBench problem of levels 1-2 is, since argmax has a kernel of ours); the outputs have
the documented structure; one seed is judged in the real sandbox."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "experiments" / "kb_coverage.py"
_spec = importlib.util.spec_from_file_location("kb_coverage", SCRIPT)
kbc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kbc)

KB = kbc.DEFAULT_KB
FILES = ["19_ReLU", "900_Flip_over_a_dimension", "25_Conv2d_Min_Tanh_Tanh"]
pytestmark = pytest.mark.skipif(not (KB / "level1").is_dir(), reason=f"no KernelBench at {KB}")

FLIP = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flip(x, [self.dim])


batch_size = 16
dim1 = 256
dim2 = 256


def get_inputs():
    return [torch.rand(batch_size, dim1, dim2)]


def get_init_inputs():
    return [1]
"""


@pytest.fixture(scope="module")
def survey(tmp_path_factory):
    kb = tmp_path_factory.mktemp("kb")
    for level, name in ((1, FILES[0]), (2, FILES[2])):
        (kb / f"level{level}").mkdir(exist_ok=True)
        (kb / f"level{level}" / f"{name}.py").write_text((KB / f"level{level}" / f"{name}.py").read_text())
    (kb / "level1" / f"{FILES[1]}.py").write_text(FLIP)
    out = tmp_path_factory.mktemp("kbc")
    doc = kbc.run(kb, [1, 2], FILES, out, sample_n=1, timeout=300, trials=2, stem="t", log=lambda *_: None)
    return out, doc


def test_outputs_and_structure(survey):
    out, doc = survey
    assert {p.name for p in out.iterdir()} == {"t.json", "t.md"}  # the resume file is gone
    on_disk = json.loads((out / "t.json").read_text())
    assert set(on_disk) == {"meta", "summary", "sample", "problems"}
    rows = {r["problem"]: r for r in on_disk["problems"]}
    assert set(rows) == set(FILES)
    for r in rows.values():
        assert r["outcome"] in kbc.OUTCOMES
        for key in ("captured", "kernels", "own_ops", "library_ops", "seed", "reason", "level"):
            assert key in r, key
    s = on_disk["summary"]
    assert s["problems"] == 3 and sum(s["by_outcome"].values()) == 3
    assert s["seed_produced"] == 3
    md = (out / "t.md").read_text()
    assert "| 19_ReLU | own |" in md and "## Per problem" in md


def test_classification(survey):
    _, doc = survey
    rows = {r["problem"]: r for r in doc["problems"]}
    relu = rows["19_ReLU"]
    assert relu["outcome"] == "own" and relu["captured"] and relu["kernels"] >= 1
    assert "relu" in relu["own_ops"] and relu["library_ops"] == [] and relu["level"] == 1
    conv = rows["25_Conv2d_Min_Tanh_Tanh"]  # the implicit-GEMM conv with its epilogue: one kernel of ours
    assert conv["outcome"] == "own" and conv["level"] == 2 and conv["kernels"] == 1
    assert {"conv", "tanh", "amin"} <= set(conv["own_ops"]) and conv["library_ops"] == []
    flip = rows["900_Flip_over_a_dimension"]
    assert flip["outcome"] == "library" and flip["kernels"] == 0 and "flip" in flip["reason"]
    ranked = dict((op, k) for op, k in doc["summary"]["library_ops_ranked"])
    assert ranked == {"flip.default": 1}, ranked


def test_sample_is_judged_by_the_sandbox(survey):
    _, doc = survey
    (s,) = doc["sample"]
    # the sample only takes seeds with kernels of ours or not, but always a real sandbox status
    assert s["problem"] in FILES
    assert s["eval"]["status"] == "correct", s
    row = next(r for r in doc["problems"] if r["problem"] == s["problem"])
    assert row["cpu_check"]["status"] == "correct"
    summ = doc["summary"]
    assert summ["cpu_checked"] == 1 and summ["cpu_check_failures"] == []
    assert summ["correct_with_own_kernel"] == (1 if row["outcome"] in ("own", "mixed") else 0)


def test_bad_problem_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--problem", "no_such_problem", "--out-dir", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "no_such_problem" in r.stderr


def test_render_keeps_findings(survey, tmp_path):
    out, _ = survey
    doc = json.loads((out / "t.json").read_text())
    doc["meta"]["findings"] = ["a finding written by hand"]
    j = tmp_path / "r.json"
    j.write_text(json.dumps(doc))
    assert kbc.main(["--render", str(j)]) == 0
    md = (tmp_path / "r.md").read_text()
    assert "## Findings" in md and "a finding written by hand" in md and "| 19_ReLU | own |" in md


def test_bad_sample_is_one_line(tmp_path, capsys):
    assert kbc.main(["--problem", "19_ReLU", "--sample", "some", "--out-dir", str(tmp_path)]) == 2
    assert "--sample 'some'" in capsys.readouterr().err
