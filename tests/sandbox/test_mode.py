"""MODE: the reference and the candidate run in the problem's mode (KernelBench's training mode by
default), so BatchNorm is judged on batch statistics unless the problem says MODE = "eval"; a
forward that draws random numbers draws the same ones for the reference and the candidate.

Before MODE, every model was put in eval(): on bn_train the running-statistics candidate passed
and the batch-statistics one failed, and the dropout reference dropped nothing."""

from __future__ import annotations

import textwrap

import pytest

from kernellab.sandbox import evaluate

DROPS_BN = textwrap.dedent('''
    import torch
    class ModelNew(torch.nn.Module):
        def __init__(self, channels):
            super().__init__()
            self.bn = torch.nn.BatchNorm2d(channels)
        def forward(self, x):
            return torch.relu(x)
''')

# the problem's source plus a subclass of its Model: same parameters and buffers (same seed)
_BN_BODY = '''
class ModelNew(Model):
    def forward(self, x):
        bn = self.bn
        shape = (1, -1, 1, 1)
        if {batch}:
            mean = x.mean(dim=(0, 2, 3), keepdim=True)
            var = x.var(dim=(0, 2, 3), unbiased=False, keepdim=True)
        else:
            mean, var = bn.running_mean.view(shape), bn.running_var.view(shape)
        y = (x - mean) * torch.rsqrt(var + bn.eps) * bn.weight.view(shape) + bn.bias.view(shape)
        return torch.relu(y)
'''


def _candidate(problem_source: str, batch: bool) -> str:
    return problem_source + textwrap.dedent(_BN_BODY.format(batch=batch))


@pytest.mark.parametrize("name, candidate, status", [
    ("bn_train", "drops_bn", "incorrect"),
    ("bn_train", "running_stats", "incorrect"),
    ("bn_train", "batch_stats", "correct"),
    ("bn_eval", "drops_bn", "incorrect"),
    ("bn_eval", "batch_stats", "incorrect"),
    ("bn_eval", "running_stats", "correct"),
])
def test_batchnorm_is_judged_in_the_problems_mode(sandbox_executor, problem, name, candidate, status):
    p = problem(name)
    source = {"drops_bn": DROPS_BN, "batch_stats": _candidate(p.source, True),
              "running_stats": _candidate(p.source, False)}[candidate]
    r = evaluate(p, source, trials=2, timing=False, device="cpu", executor=sandbox_executor)
    assert r["status"] == status, (r["status"], r["error_text"])
    assert r["details"]["mode"] == ("eval" if name == "bn_eval" else "train")


DROPOUT_TORCH = textwrap.dedent('''
    import torch
    class ModelNew(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.dropout(x, 0.5, training=self.training) * 3.0
''')

DROPOUT_NONE = DROPOUT_TORCH.replace("torch.nn.functional.dropout(x, 0.5, training=self.training)", "x")
DROPOUT_OWN_DRAW = DROPOUT_TORCH.replace("torch.nn.functional.dropout(x, 0.5, training=self.training)",
                                         "x * (torch.rand_like(x) > 0.5) * 2.0")


@pytest.mark.parametrize("source, status", [(DROPOUT_TORCH, "correct"), (DROPOUT_NONE, "incorrect"),
                                            (DROPOUT_OWN_DRAW, "incorrect")])
def test_dropout_draws_the_same_numbers_in_reference_and_candidate(sandbox_executor, problem, source, status):
    # three trials, timing on: each checked call (trials, the follow-up check) is reseeded alike
    r = evaluate(problem("dropout_train"), source, trials=3, timing=True, device="cpu", executor=sandbox_executor)
    assert r["status"] == status, (r["status"], r["error_text"])


@pytest.mark.gpu
def test_training_mode_on_cuda_full_size_with_baselines(sandbox_executor, problem):
    """On the GPU: batch statistics pass and a dropped BatchNorm fails at full size, the baselines
    (eager and torch.compile of the training-mode reference) are measured, torch's dropout on CUDA
    draws the same numbers after the reseed, and the builtin's training BatchNorm seed is correct."""
    from kernellab.agents.builtin import build

    p = problem("bn_train")
    r = evaluate(p, _candidate(p.source, True), small=False, device="cuda", trials=3, executor=sandbox_executor)
    assert r["status"] == "correct", r["error_text"]
    assert r["eager_ms"] and r["compile_ms"], r["details"].get("baseline")
    r = evaluate(p, DROPS_BN, small=False, device="cuda", trials=2, timing=False, executor=sandbox_executor)
    assert r["status"] == "incorrect"
    r = evaluate(problem("dropout_train"), DROPOUT_TORCH, small=False, device="cuda", trials=3,
                 executor=sandbox_executor)
    assert r["status"] == "correct", r["error_text"]
    r = evaluate(p, build(p).source, small=False, device="cuda", trials=3, timing=False, executor=sandbox_executor)
    assert r["status"] == "correct" and r["library_only"] is False, r["error_text"]
