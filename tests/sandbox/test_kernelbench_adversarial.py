"""KernelBench's own adversarial cases (src/kernelbench/unit_tests/test_eval_adversarial.py) through
kernellab's sandbox: none may be judged ``correct``, and each gets the status its header names.

KernelBench's kernels are C++ extensions (``load_inline``); the files in ``kb_adversarial/`` are the
same hacks written as kernellab candidates (plain torch, or CuPy on the GPU), each naming the case it
mirrors. Headers as in ``adversarial/``: ``# expect: STATUS [ERROR_CLASS]``, ``# gpu``, ``# timing: on``,
``# problem: NAME`` (a problem of ``problems/``). Without ``# gpu`` a case runs on the CPU here and
on the GPU on a CUDA host.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from kernellab.sandbox import EvalJob

HERE = Path(__file__).resolve().parent
FILES = sorted((HERE / "kb_adversarial").glob("*.py"))
CUDA = torch.cuda.is_available()


def header(path: Path) -> dict:
    h = {"gpu": False, "timing": False, "problem": None}
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        m = re.match(r"#\s*(\w+)\s*:?\s*(.*)$", line)
        if not m:
            continue
        key, val = m.group(1), m.group(2).strip()
        if key == "expect":
            h["status"], h["error_class"] = (val.split() + [None])[:2]
        elif key == "gpu":
            h["gpu"] = True
        elif key == "timing":
            h["timing"] = val == "on"
        elif key == "problem":
            h["problem"] = val
    assert "status" in h and h["problem"], f"{path.name}: needs '# expect:' and '# problem:' headers"
    return h


def test_every_kernelbench_case_is_mirrored() -> None:
    """The three hacks of KernelBench's test_eval_adversarial.py each have a candidate here."""
    names = "\n".join(f.read_text() for f in FILES)
    for case in ("test_result_cache_reuse", "test_input_modification", "test_non_default_stream"):
        assert f"test_eval_adversarial.py::{case}" in names, case
    assert all(header(f)["status"] != "correct" for f in FILES)


CONTROL = """
import torch


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)
"""


@pytest.fixture(scope="module")
def results(sandbox_executor, problem):
    # the control shows the problem and the checks pass an honest candidate: the verdicts below are the hacks'
    futures = {"control": sandbox_executor.submit(EvalJob(problem("square_matmul"), CONTROL, trials=3))}
    for f in FILES:
        h = header(f)
        if h["gpu"] and not CUDA:
            continue
        futures[f.stem] = sandbox_executor.submit(EvalJob(problem(h["problem"]), f.read_text(), trials=3,
                                                          timing=h["timing"]))
    return futures


def test_control_honest_matmul_is_correct(results) -> None:
    r = results["control"].result(timeout=600)
    assert r["status"] == "correct", r["error_text"]


@pytest.mark.parametrize("path", [pytest.param(f, id=f.stem, marks=[pytest.mark.gpu] if header(f)["gpu"] else [])
                                  for f in FILES])
def test_kernelbench_hack_is_not_judged_correct(path: Path, results) -> None:
    h = header(path)
    r = results[path.stem].result(timeout=600)
    got = (r["status"], r["error_class"])
    assert r["status"] != "correct", f"{path.name}: kernellab judged KernelBench's hack correct"
    assert got == (h["status"], h["error_class"]), f"{path.name}: got {got}\n{r['error_text']}"
    if r["status"] == "rejected":
        assert r["details"]["integrity"][0]["reason"] == h["error_class"].split(":", 1)[1]
    assert r["error_text"]
