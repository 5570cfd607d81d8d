"""A sandbox worker sets up kernellab's runtime at its start (kernellab._runtime.setup), as its import of
kernellab did before issue 33: a candidate finds ``ast.parse`` behind the lock."""

from __future__ import annotations

import textwrap

from kernellab.sandbox import evaluate

SEES_THE_LOCK = textwrap.dedent('''
    import ast
    import torch
    LOCKED = getattr(ast.parse, "__module__", None) == "kernellab._astlock"
    class ModelNew(torch.nn.Module):
        def forward(self, x):
            out = torch.relu(x * 2.0) + 1.0
            return out if LOCKED else out + 1.0
''')


def test_a_worker_has_set_up_the_runtime(sandbox_executor, problem):
    r = evaluate(problem("tiny_relu"), SEES_THE_LOCK, trials=1, timing=False, executor=sandbox_executor)
    assert r["status"] == "correct", (r["status"], r["error_text"])
