"""Generated kernels per group kind against the PyTorch reference, in the Triton interpreter.

Each test builds one candidate (capture at the problem's sizes) and then runs it at several odd
shapes (1, 127, 2^k +- 1): the generated code reads every size at run time, so one candidate must
be right at all of them.
"""

from __future__ import annotations

import pytest
import torch

from kernellab.agents.builtin import ReductionMode, SetConfig, build, built
from kernellab.problem import Problem, apply_mode

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DEV = "cuda" if torch.cuda.is_available() else "cpu"  # CPU tensors run in the Triton interpreter
_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def problem(body: str, dtype: torch.dtype, init: str = "", consts: str = "") -> Problem:
    src = f"""import torch

DTYPE = {_NAME[dtype]!r}
{consts}


class Model(torch.nn.Module):
    def __init__(self{', ' + init if init else ''}):
        super().__init__()
{body}


def get_inputs():
    return INPUTS()


def get_init_inputs():
    return [globals()[k] for k in INIT] if INIT and isinstance(INIT[0], str) else INIT
"""
    return Problem(name="t", source=src)


def run(load, close, p: Problem, cases: list[tuple[list, list]], dtype: torch.dtype, actions=(), kernels: int | None = None,
        atol: float | None = None, rtol: float | None = None) -> None:
    code = build(p, actions)
    if kernels is not None:
        assert code.meta["kernels"] == kernels, code.meta["groups"]
    mod = load(code.source)
    for init, inputs in cases:
        torch.manual_seed(0)
        ref = apply_mode(mod.Model(*init).to(DEV, dtype), p.mode)
        torch.manual_seed(0)
        new = apply_mode(mod.ModelNew(*init).to(DEV, dtype), p.mode)
        xs = [(x.to(dtype) if x.is_floating_point() else x).to(DEV) for x in inputs]
        with torch.no_grad():
            close(new(*xs), ref(*xs), dtype, atol, rtol)


# -- pointwise --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_pointwise_chain_with_broadcast(load, close, dtype):
    body = """        self.scale = 0.7

    def forward(self, x, y):
        h = torch.nn.functional.gelu(x, approximate="tanh") * self.scale + torch.sigmoid(y)
        return h - x.clamp(-0.5, 0.5) ** 2 + torch.where(x > 0, torch.tanh(x), torch.nn.functional.silu(y))"""
    consts = "INIT = []\nINPUTS = lambda: [torch.randn(4, 33), torch.randn(33)]"
    p = problem(body, dtype, consts=consts)
    shapes = [(1, 1), (1, 127), (3, 129), (5, 17)]  # sizes change at run time; ranks never do
    # sigmoid(y) and silu(y) have y's smaller shape: they are recomputed inside the one kernel
    run(load, close, p, [([], [torch.randn(*s), torch.randn(s[-1])]) for s in shapes], dtype, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_pointwise_channel_broadcast_and_noncontiguous_input(load, close, dtype):
    body = """        self.b = torch.nn.Parameter(torch.randn(c, 1, 1))

    def forward(self, x):
        return torch.relu(x + self.b) * 0.5"""
    consts = "c = 3\nSMALL = {'c': 2}\nINIT = ['c']\nINPUTS = lambda: [torch.randn(2, c, 5, 7)]"
    p = problem(body, dtype, init="c", consts=consts)
    cases = [([c], [torch.randn(n, c, h, w)]) for n, c, h, w in [(1, 1, 1, 1), (2, 3, 5, 7), (1, 4, 9, 15)]]
    cases.append(([3], [torch.randn(2, 5, 7, 3).permute(0, 3, 1, 2)]))  # strided input
    run(load, close, p, cases, dtype, kernels=1)


# -- rows: reductions with prologue and epilogue -----------------------------------------------------

SOFTMAX = """        pass

    def forward(self, x, b):
        return torch.softmax(x * 2.0 + b, dim=-1) * 3.0"""


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["one_pass", "multi_pass"])
def test_softmax_prologue_epilogue(load, close, dtype, mode):
    consts = "INIT = []\nINPUTS = lambda: [torch.randn(8, 64), torch.randn(64)]"
    p = problem(SOFTMAX, dtype, consts=consts)
    gid = next(g.id for g in built(p).groups if g.kind == "rows")
    actions = [ReductionMode(gid, mode)]
    if mode == "multi_pass":  # chunks of 32 columns: rows of 127/129 take several loop trips
        actions.append(SetConfig(gid, (("BLOCK_R", 32),)))
    cases = [([], [torch.randn(m, n), torch.randn(n)]) for m, n in [(1, 1), (3, 127), (5, 129), (2, 32)]]
    run(load, close, p, cases, dtype, actions, kernels=1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reductions_over_a_middle_dim(load, close, dtype):
    body = """        pass

    def forward(self, x):
        return x.sum(dim=1), x.amax(dim=1, keepdim=True), torch.log_softmax(x, dim=1), x.mean(dim=(1, 2))"""
    consts = "INIT = []\nINPUTS = lambda: [torch.randn(2, 9, 4)]"
    p = problem(body, dtype, consts=consts)
    cases = [([], [torch.randn(*s)]) for s in [(1, 1, 1), (2, 127, 3), (3, 17, 33)]]
    run(load, close, p, cases, dtype, atol=2e-4 if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norms(load, close, dtype):
    body = """        self.ln = torch.nn.LayerNorm(n)
        self.rms = torch.nn.RMSNorm(n, eps=1e-6)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)
            self.rms.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        return self.ln(x), self.rms(x), x.var(dim=-1), torch.logsumexp(x, dim=-1)"""
    consts = "n = 64\nSMALL = {'n': 33}\nINIT = ['n']\nINPUTS = lambda: [torch.randn(4, n)]"
    p = problem(body, dtype, init="n", consts=consts)
    cases = [([n], [torch.randn(m, n)]) for m, n in [(1, 1), (3, 127), (2, 129), (1, 255)]]
    # var of one element is nan (n - 1 = 0) in both
    run(load, close, p, cases, dtype, kernels=1, atol=3e-4 if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", DTYPES)
def test_group_and_instance_norm(load, close, dtype):
    body = """        self.gn = torch.nn.GroupNorm(g, c)
        self.inorm = torch.nn.InstanceNorm2d(c, affine=True)
        with torch.no_grad():
            self.gn.weight.uniform_(0.5, 1.5)
            self.inorm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.gn(x), self.inorm(x)"""
    consts = "g = 2\nc = 4\nSMALL = {'g': 3, 'c': 6}\nINIT = ['g', 'c']\nINPUTS = lambda: [torch.randn(2, c, 5, 5)]"
    p = problem(body, dtype, init="g, c", consts=consts)
    cases = [([g, c], [torch.randn(n, c, h, w)]) for g, c, n, h, w in [(2, 4, 2, 5, 5), (3, 6, 1, 7, 9), (1, 2, 3, 1, 2)]]
    run(load, close, p, cases, dtype, atol=3e-4 if dtype == torch.float32 else 3e-2)


# -- GEMM groups ----------------------------------------------------------------------------------

GEMM_EPILOGUE = """        self.linear = torch.nn.Linear(k, n)

    def forward(self, x, r):
        return torch.relu(self.linear(x)) * 0.5 + r"""


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_bias_activation_residual(load, close, dtype):
    consts = "k = 32\nn = 48\nSMALL = {'k': 16, 'n': 17}\nINIT = ['k', 'n']\nINPUTS = lambda: [torch.randn(8, k), torch.randn(8, n)]"
    p = problem(GEMM_EPILOGUE, dtype, init="k, n", consts=consts)
    cases = [([k, n], [torch.randn(m, k), torch.randn(m, n)]) for m, k, n in [(1, 17, 1), (33, 64, 127), (5, 31, 65)]]
    run(load, close, p, cases, dtype, kernels=1, atol=2e-4 if dtype == torch.float32 else 3e-2)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["softmax", "log_softmax", "logsumexp", "layernorm", "sum", "amax"])
def test_gemm_row_reduction_fused(load, close, dtype, reduction):
    fwd = {"softmax": "torch.softmax(h, dim=-1)", "log_softmax": "torch.log_softmax(h, dim=-1)",
           "logsumexp": "torch.logsumexp(h, dim=-1)", "layernorm": "self.ln(h)", "sum": "h.sum(dim=-1)",
           "amax": "h.amax(dim=-1)"}[reduction]
    body = f"""        self.linear = torch.nn.Linear(k, n)
        self.ln = torch.nn.LayerNorm(n)

    def forward(self, x):
        h = self.linear(x) * 0.5
        return {fwd}"""
    consts = "k = 32\nn = 48\nSMALL = {'k': 16, 'n': 17}\nINIT = ['k', 'n']\nINPUTS = lambda: [torch.randn(8, k)]"
    p = problem(body, dtype, init="k, n", consts=consts)
    groups = [g for g in built(p).groups if g.kind != "torch"]
    assert len(groups) == 1 and groups[0].kind == "gemm" and groups[0].row_reduction, [
        g.describe(built(p).graph) for g in groups]
    cases = [([k, n], [torch.randn(m, k)]) for m, k, n in [(1, 17, 1), (33, 64, 127), (4, 16, 129)]]
    run(load, close, p, cases, dtype, kernels=1, atol=3e-4 if dtype == torch.float32 else 5e-2, rtol=3e-4 if dtype == torch.float32 else 5e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bmm_scaled(load, close, dtype):
    body = """        pass

    def forward(self, a, b):
        return torch.bmm(a, b) * 0.25 - 1.0"""
    consts = "INIT = []\nINPUTS = lambda: [torch.randn(2, 8, 16), torch.randn(2, 16, 8)]"
    p = problem(body, dtype, consts=consts)
    cases = [([], [torch.randn(b, m, k), torch.randn(b, k, n)]) for b, m, k, n in [(1, 1, 16, 1), (3, 33, 17, 127)]]
    run(load, close, p, cases, dtype, kernels=1, atol=2e-4 if dtype == torch.float32 else 5e-2)


# -- convolutions: our conv kernel with the eval BatchNorm and activation in its epilogue ---------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv_with_fused_tail(load, close, dtype):
    body = """        self.conv = torch.nn.Conv2d(c, 2 * c, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(2 * c)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return torch.nn.functional.hardswish(self.bn(self.conv(x)))"""
    consts = "MODE = 'eval'\nc = 3\nSMALL = {'c': 2}\nINIT = ['c']\nINPUTS = lambda: [torch.randn(2, c, 6, 6)]"
    p = problem(body, dtype, init="c", consts=consts)
    code = build(p)
    assert code.meta["uncaptured"] == [] and any(" conv [" in g for g in code.meta["groups"]), code.meta
    cases = [([c], [torch.randn(n, c, h, h)]) for c, n, h in [(3, 2, 6), (1, 1, 5), (2, 3, 9)]]
    run(load, close, p, cases, dtype, kernels=1, atol=1e-3 if dtype == torch.float32 else 2e-2)
