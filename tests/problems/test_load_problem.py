"""Malformed problems: each gives one clear error naming the file, exit 2 from the CLI, nothing written."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernellab import Problem, ProblemError, load_problem

GOOD = textwrap.dedent('''
    import torch
    n = 64
    SMALL = {"n": 8}
    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2
    def get_inputs():
        return [torch.randn(n, n)]
    def get_init_inputs():
        return []
''')

BAD = {
    "syntax": ("def broken(:\n    pass\n", "syntax error"),
    "not_python": ("\x7fELF\x02\x01 binary junk \x00\x01", "not valid Python"),
    "missing_model": (GOOD.replace("class Model(", "class Other("), "missing Model"),
    "missing_get_inputs": (GOOD.replace("def get_inputs", "def get_inputz"), "missing get_inputs"),
    "missing_init": (GOOD.replace("def get_init_inputs", "def get_init_inputz"), "missing get_init_inputs"),
    "inputs_raise": (GOOD.replace("return [torch.randn(n, n)]", "raise RuntimeError('boom')"), "get_inputs raised RuntimeError: boom"),
    "init_raise": (GOOD.replace("return []", "return 1/0"), "get_init_inputs raised ZeroDivisionError"),
    "model_raise": (GOOD.replace("class Model(torch.nn.Module):", "class Model(torch.nn.Module):\n    def __init__(self):\n"
                                 "        super().__init__(); raise ValueError('bad init')"), "building Model raised ValueError"),
    "non_tensor": (GOOD.replace("return torch.relu(x) * 2", "return {'y': x}"), "not a tensor or a tuple of tensors"),
    "small_unknown": (GOOD.replace('SMALL = {"n": 8}', 'SMALL = {"m": 8}'), "SMALL names 'm'"),
    "import_error": ("import not_a_module_xyz\n" + GOOD, "ModuleNotFoundError"),
    "model_not_module": (GOOD.replace("class Model(torch.nn.Module):", "class Model:"), "not a torch.nn.Module"),
    "bad_dtype": ('DTYPE = "float64"\n' + GOOD, "DTYPE"),
    "bad_mode": ('MODE = "inference"\n' + GOOD, "MODE 'inference' is not one of 'train', 'eval'"),
    "mode_not_literal": ('MODE = "ev" + "al"\n' + GOOD, "MODE must be a literal string"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_malformed_problem_is_one_clear_error(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    f = tmp_path / f"{case}.py"
    f.write_bytes(text.encode("utf-8", "surrogateescape")) if isinstance(text, str) else f.write_bytes(text)
    with pytest.raises(ProblemError) as info:
        load_problem(f)
    msg = str(info.value)
    assert str(f) in msg and expected in msg and "\n" not in msg


def test_not_utf8_file(tmp_path: Path) -> None:
    f = tmp_path / "binary.py"
    f.write_bytes(b"\xff\xfe\x00\x01\x02binary")
    with pytest.raises(ProblemError, match="not a Python source file"):
        load_problem(f)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(ProblemError, match="no such file"):
        load_problem(tmp_path / "nope.py")


def test_good_problem_and_small_sizes(tmp_path: Path) -> None:
    f = tmp_path / "good.py"
    f.write_text(GOOD)
    p = load_problem(f)
    assert p.name == "good" and len(p.id) == 16
    assert p.module(small=True).n == 8 and p.module().n == 64
    assert p.settings() == {"dtype": "float32", "atol": 1e-4, "rtol": 1e-4, "small": {"n": 8}, "mode": "train"}


def test_dtype_casts_inputs_and_weights(tmp_path: Path) -> None:
    from kernellab.problem import instantiate

    f = tmp_path / "half.py"
    f.write_text('DTYPE = "bfloat16"\nATOL = 0.05\n' + GOOD.replace(
        "def forward", "def __init__(self):\n        super().__init__(); self.l = torch.nn.Linear(4, 4)\n    def forward"))
    p = load_problem(f)
    inst = instantiate(p, small=True, seed=0)
    assert inst.inputs[0].dtype == torch.bfloat16 and inst.model.l.weight.dtype == torch.bfloat16
    assert p.settings()["atol"] == 0.05 and p.settings()["rtol"] == 1e-2


@pytest.mark.parametrize("case", ["syntax", "missing_model", "inputs_raise", "non_tensor", "small_unknown"])
def test_cli_exit_2_and_nothing_written(tmp_path: Path, case: str) -> None:
    f = tmp_path / f"{case}.py"
    f.write_text(BAD[case][0])
    cand = tmp_path / "cand.py"
    cand.write_text("import torch\nclass ModelNew(torch.nn.Module):\n    pass\n")
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "eval", str(f), str(cand)],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0]
    assert not list(tmp_path.glob("*.db"))


def test_from_module_roundtrip() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
    p = Problem.from_module(model, [torch.randn(4, 8)], name="seq", atol=1e-3)
    mod = p.module()
    m = mod.Model()
    x = torch.randn(4, 8)
    torch.testing.assert_close(m(x), model(x))
    assert p.settings()["atol"] == 1e-3
    assert mod.get_inputs()[0].shape == (4, 8)


def test_from_module_rejects_non_module() -> None:
    with pytest.raises(ProblemError, match="not a torch.nn.Module"):
        Problem.from_module(lambda x: x, [torch.randn(2)], name="f")


BN = GOOD.replace("def forward", "def __init__(self):\n        super().__init__(); self.bn = torch.nn.BatchNorm1d(n)\n"
                  "    def forward").replace("return torch.relu(x) * 2", "return self.bn(x)")


@pytest.mark.parametrize("declared, training", [("", True), ('MODE = "train"\n', True), ('MODE = "eval"\n', False),
                                               ('MODE: str = "eval"\n', False)])
def test_mode_puts_the_built_model_in_train_or_eval(tmp_path: Path, declared: str, training: bool) -> None:
    from kernellab.problem import instantiate

    f = tmp_path / "bn.py"
    f.write_text(declared + BN)
    p = load_problem(f)
    assert p.mode == p.settings()["mode"] == ("train" if training else "eval")
    inst = instantiate(p, small=True, seed=0)
    assert inst.model.training is training and inst.model.bn.training is training


@pytest.mark.parametrize("training", [True, False])
def test_from_module_records_the_models_own_mode(training: bool) -> None:
    from kernellab.problem import instantiate

    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16)).train(training)
    p = Problem.from_module(model, [torch.randn(4, 8)], name="seq_bn")
    assert p.mode == p.settings()["mode"] == ("train" if training else "eval")
    inst = instantiate(p, small=False, seed=0)
    assert inst.model.training is training and inst.model.inner[1].training is training
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(inst.model(x), model(x))


def test_settings_execute_the_source_once() -> None:
    """The coordinator asks a problem's settings for every child it codes: the source (a from_module
    problem's whole pickled model) runs once, and each caller gets its own copy."""
    source = GOOD + "\nEXECUTED.append(1)\nATOL = 1e-3\n"
    runs: list[int] = []
    import builtins

    builtins.EXECUTED = runs
    try:
        p = Problem(name="once", source=source)
        first = p.settings()
        first["small"]["n"] = 999
        again = p.settings()
    finally:
        del builtins.EXECUTED
    assert runs == [1] and again["atol"] == 1e-3 and again["small"] == {"n": 8}


def test_from_module_stands_in_for_large_parameters() -> None:
    """Large parameters do not travel in the source: seeded draws of their shape, mean and std do, tied
    parameters stay tied, buffers travel exactly, and the user's model is left where it was."""
    lin = torch.nn.Linear(64, 64)
    with torch.no_grad():
        lin.weight.mul_(10).add_(3)
    model = torch.nn.Sequential(lin, torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 64))
    model[2].weight = lin.weight  # tied
    model[1].running_mean.fill_(0.5)
    exact = Problem.from_module(model, [torch.randn(4, 64)], name="big")
    small = Problem.from_module(model, [torch.randn(4, 64)], name="big", stand_in_above=1000)
    assert len(small.source) < len(exact.source) - 64 * 64 * 4  # the (tied) weight stayed behind
    m = small.module().Model().inner
    w = m[0].weight
    assert w.shape == (64, 64) and not torch.equal(w, lin.weight)
    assert abs(float(w.mean()) - float(lin.weight.mean())) < 0.2
    assert abs(float(w.std()) / float(lin.weight.std()) - 1) < 0.1
    assert m[2].weight is w and torch.equal(m[0].bias, lin.bias)  # tied; the small bias travelled
    assert torch.equal(m[1].running_mean, model[1].running_mean)
    assert torch.equal(small.module().Model().inner[0].weight, w)  # seeded: every import draws the same
    assert lin.weight.device.type == "cpu" and not lin.weight.is_meta
