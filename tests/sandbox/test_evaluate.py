"""evaluate(): configs, seeding, bad arguments, the CLI, and the result record."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from kernellab.sandbox import RESULT_KEYS, EvalJob, SandboxError, evaluate

RELU_CFG = textwrap.dedent('''
    import torch
    CONFIG = {"SCALE": 1.0}
    SPACE = {"SCALE": [1.0, 3.0]}
    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 2.0) * CONFIG["SCALE"] + 1.0
''')

LINEAR_SUBCLASS = textwrap.dedent('''
    import torch
    class Model(torch.nn.Module):
        def __init__(self, features):
            super().__init__()
            self.linear = torch.nn.Linear(features, features)
        def forward(self, x):
            return self.linear(x)
    class ModelNew(Model):
        def forward(self, x):
            return torch.addmm(self.linear.bias, x, self.linear.weight.t())
''')

LINEAR_OWN_WEIGHTS = LINEAR_SUBCLASS.replace(
    "class ModelNew(Model):\n",
    "class ModelNew(Model):\n    def __init__(self, features):\n        super().__init__(features)\n"
    "        torch.nn.init.normal_(self.linear.weight)\n")
assert LINEAR_OWN_WEIGHTS != LINEAR_SUBCLASS


@pytest.mark.parametrize("config, status", [(None, "correct"), ({"SCALE": 1.0}, "correct"),
                                            ({"SCALE": 3.0}, "incorrect")])
def test_config_is_applied_before_construction(sandbox_executor, problem, config, status):
    r = evaluate(problem("tiny_relu"), RELU_CFG, config=config, trials=2, timing=False, executor=sandbox_executor)
    assert r["status"] == status, r["error_text"]
    assert r["config"] == (config or {})


def test_unknown_config_key_is_a_compile_error(sandbox_executor, problem):
    r = evaluate(problem("tiny_relu"), RELU_CFG, config={"BLOCK": 64}, trials=1, timing=False,
                 executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("compile_error", "config")


def test_model_and_modelnew_are_seeded_alike(sandbox_executor, problem):
    p = problem("tiny_linear")
    good = sandbox_executor.submit(EvalJob(p, LINEAR_SUBCLASS, trials=3, timing=False))
    bad = sandbox_executor.submit(EvalJob(p, LINEAR_OWN_WEIGHTS, trials=3, timing=False))
    assert good.result()["status"] == "correct", good.result()["error_text"]
    assert bad.result()["status"] == "incorrect"


def test_cpu_result_is_interpreted_with_timings_and_no_speedups(sandbox_executor, problem):
    r = evaluate(problem("tiny_relu"), RELU_CFG, trials=2, executor=sandbox_executor)
    assert tuple(r) == RESULT_KEYS
    assert r["status"] == "correct" and r["interpreted"] is True
    assert r["median_ms"] > 0 and r["eager_ms"] > 0 and r["p20_ms"] <= r["median_ms"] <= r["p80_ms"]
    assert r["speedup_eager"] is None and r["speedup_compile"] is None and r["compile_ms"] is None
    assert "torch.compile" in r["details"]["compile"]
    assert r["versions"]["torch"] == torch.__version__ and r["device"].startswith("cpu")
    assert r["details"]["small"] is True


@pytest.mark.parametrize("kwargs", [{"device": "tpu"}, {"trials": 0}] +
                         ([] if torch.cuda.is_available() else [{"device": "cuda"}]))
def test_bad_arguments_raise(sandbox_executor, problem, kwargs):
    with pytest.raises(SandboxError):
        evaluate(problem("tiny_relu"), RELU_CFG, executor=sandbox_executor, **kwargs)


def test_cli_eval_gemm_bias_gelu_triton_small(root):
    cmd = [sys.executable, "-m", "kernellab.cli", "eval", "experiments/problems/fusions/gemm_bias_gelu.py",
           "experiments/candidates/gemm_bias_gelu_triton.py", "--small"]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "status: correct" in out.stdout
    if not torch.cuda.is_available():
        assert "interpreted" in out.stdout


def test_cli_eval_bad_config_exits_2(root):
    cmd = [sys.executable, "-m", "kernellab.cli", "eval", "experiments/problems/fusions/gemm_bias_gelu.py",
           "experiments/candidates/gemm_bias_gelu_triton.py", "--config", "[1, 2]", "--json"]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "JSON object" in out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_cli_eval_cuda_without_cuda_exits_2(root):
    cmd = [sys.executable, "-m", "kernellab.cli", "eval", "experiments/problems/fusions/gemm_bias_gelu.py",
           "experiments/candidates/gemm_bias_gelu_triton.py", "--device", "cuda"]
    out = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "no CUDA device" in out.stderr, out.stderr


def test_a_swap_that_keeps_the_inputs_fingerprint_is_still_caught():
    """Two input elements whose fingerprint weights are equal (positions 65521 apart) swapped in place:
    both weighted sums stay the same, so only a bitwise comparison with the kept copy sees it."""
    from kernellab import Problem

    p = Problem(name="swap_inputs", source=textwrap.dedent('''
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x * 2.0) + 1.0
        def get_inputs():
            return [torch.randn(300, 300)]
        def get_init_inputs():
            return []
    '''))
    src = textwrap.dedent('''
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.relu(x * 2.0) + 1.0
        class ModelNew(Model):
            def forward(self, x):
                y = torch.relu(x * 2.0) + 1.0
                f = x.view(-1)
                a = f[0].clone()
                f[0] = f[65521]
                f[65521] = a
                return y
    ''')
    r = evaluate(p, src, device="cpu", small=False, trials=2, timing=False)
    assert (r["status"], r["error_class"]) == ("rejected", "integrity:inputs_modified"), r["error_text"]


# A reference whose float64 copy (the anchor a synthetic trial's mismatch is judged against) fails, and a
# candidate off by 0.1 wherever the inputs exceed 2 (the `large` and `mixed` trials, not `problem`).
FP64_FAILS = '''import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(32, 16)

    def forward(self, x):
        if x.dtype == torch.float64:
            raise {exc}("{text}")
        return self.linear(x)


def get_inputs():
    return [torch.rand(8, 32)]


def get_init_inputs():
    return []
'''
OFF_ON_LARGE_INPUTS = textwrap.dedent('''
    import torch
    class ModelNew(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(32, 16)
        def forward(self, x):
            y = self.linear(x)
            return y + 0.1 if float(x.abs().max()) > 2 else y
''')


def test_an_fp64_anchor_out_of_memory_is_ours_not_a_mismatch(sandbox_executor):
    # the fp64 copy of KernelBench's 69 did not fit its job's grant: the job is retried with more memory
    # (and, here where no grant ever fits, ends as our failure), never a mismatch it could not judge
    from kernellab.problem import Problem

    p = Problem("fp64_oom", FP64_FAILS.format(exc="torch.OutOfMemoryError", text="out of memory (the fp64 copy)"))
    r = evaluate(p, OFF_ON_LARGE_INPUTS, trials=4, timing=False, device="cpu", executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("crash", "infra:oom"), (r["status"], r["error_text"])
    assert "_anchor" in r["error_text"]


def test_an_fp64_anchor_that_cannot_run_says_why_and_the_mismatch_stands(sandbox_executor):
    from kernellab.problem import Problem

    p = Problem("fp64_type", FP64_FAILS.format(exc="TypeError", text="no float64 here"))
    r = evaluate(p, OFF_ON_LARGE_INPUTS, trials=4, timing=False, device="cpu", executor=sandbox_executor)
    assert (r["status"], r["error_class"]) == ("incorrect", "mismatch"), (r["status"], r["error_text"])
    bad = r["details"]["trials"][-1]
    assert bad["distribution"] == "large" and bad["out0_fp64"] == {"ok": False,
                                                                   "unavailable": "TypeError: no float64 here"}
