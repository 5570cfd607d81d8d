"""Builtin bugs the KernelBench coverage survey found (experiments/results/2026-11-30-kb-coverage.md),
each on a small copy of the KernelBench problem's pattern: the seed must be correct at the small size
and keep the full size's values out of the generated code."""

from __future__ import annotations

import pytest

from kernellab import sandbox
from kernellab.agents.builtin import build
from kernellab.compiler import capture
from kernellab.compiler.ir import Dyn
from kernellab.problem import Problem

TRIL = '''import torch

N = 48
SMALL = {"N": 16}


class Model(torch.nn.Module):
    def forward(self, A, B):
        return torch.tril(torch.matmul(A, B))


def get_inputs():
    return [torch.tril(torch.rand(N, N)), torch.tril(torch.rand(N, N))]


def get_init_inputs():
    return []
'''


def _judge(p: Problem) -> dict:
    res = sandbox.evaluate(p, build(p).source, small=True, device="cpu", trials=2, timing=False)
    assert res["status"] == "correct", f"{res['status']}: {res['error_text']}"
    return res


def test_bool_mask_is_not_a_gemm_epilogue_operand():
    # 15_Matmul_for_lower_triangular_matrices: tril decomposes to where(le(...), mm, 0); the bool mask
    # (computed by PyTorch) was taken as an epilogue operand that the GEMM launcher refuses
    p = Problem("tril_mm", TRIL)
    code = build(p)
    assert code.meta["kernels"] >= 1
    res = _judge(p)
    assert res["library_only"] is False


POOL = '''import torch

batch_size = 16
in_features = 64
out_features = 64
pool_kernel_size = 16
SMALL = {"batch_size": 4, "in_features": 16, "out_features": 16, "pool_kernel_size": 8}


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features, pool_kernel_size):
        super().__init__()
        self.matmul = torch.nn.Linear(in_features, out_features)
        self.avg_pool = torch.nn.AvgPool1d(kernel_size=pool_kernel_size)

    def forward(self, x):
        x = self.matmul(x)
        x = self.avg_pool(x.unsqueeze(1)).squeeze(1)
        return torch.max(torch.nn.functional.gelu(x) * 2.0, dim=1).values


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, pool_kernel_size]
'''


def test_tuple_attribute_resolves_a_pool_size():
    # 98_Matmul_AvgPool_GELU_Scale_Max: nn.AvgPool1d keeps kernel_size as the tuple (16,); the SMALL
    # capture failed and the seed baked 16, too large for the small input
    p = Problem("pool_tuple", POOL)
    g = capture(p)
    assert not any("SMALL capture failed" in n for n in g.notes), g.notes
    pool = [n for n in g.nodes if n.op.startswith("avg_pool")]
    ks = pool[0].args[1]  # avg_pool1d runs as avg_pool2d over [1, k]
    assert [k.expr for k in ks if isinstance(k, Dyn)] == ["self.avg_pool.kernel_size[0]"], ks
    _judge(p)


SDPA = '''import torch

B, H, S, E = 2, 2, 16, 64
SMALL = {"B": 1, "H": 2, "S": 8, "E": 8}


class Model(torch.nn.Module):
    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def get_inputs():
    return [torch.rand(B, H, S, E), torch.rand(B, H, S, E), torch.rand(B, H, S, E)]


def get_init_inputs():
    return []
'''


def test_attention_scale_follows_the_head_size():
    # 97_ScaledDotProductAttention: the decomposition scales q and k by E ** -0.25, which matched no
    # size expression, so the seed baked the full size's scale
    p = Problem("sdpa_scale", SDPA)
    g = capture(p)
    assert not any("SMALL capture failed" in n for n in g.notes), g.notes
    scales = [a for n in g.nodes for a in n.args if isinstance(a, Dyn) and "-0.25" in a.expr]
    assert scales and abs(float(scales[0]) - 64 ** -0.25) < 1e-12
    # both attention GEMMs ([B, H, S, E] @ [B, H, E, T]) are bmm kernels of ours, not cuBLAS calls
    assert "matmul.default" not in g.uncaptured
    assert [n.shape for n in g.nodes if n.kind == "gemm"] == [(4, 16, 16), (4, 16, 64)]
    res = _judge(p)
    assert res["library_only"] is False


CONST = '''import torch

batch_size = 4
features = 32
constant_value = 0.5
SMALL = {"batch_size": 2, "features": 8}


class Model(torch.nn.Module):
    def __init__(self, features, constant_value):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)
        self.constant_value = constant_value

    def forward(self, x):
        x = self.linear(x)
        x = torch.min(x, torch.tensor(self.constant_value))
        return torch.min(x * 2.0, torch.tensor(0.25, device=x.device))


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, constant_value]
'''


def test_zero_dim_constant_built_in_forward_is_a_number():
    # 31_Conv2d_Min_Add_Multiply, 83_..., 93_...: torch.tensor(c) in forward was refused by capture
    p = Problem("const_in_forward", CONST)
    g = capture(p)
    mins = [n for n in g.nodes if n.op == "minimum"]
    assert sorted(a for n in mins for a in n.args if isinstance(a, float)) == [0.25, 0.5]
    res = _judge(p)
    assert res["library_only"] is False


def test_larger_tensor_constant_built_in_forward_is_still_refused():
    src = CONST.replace("torch.tensor(self.constant_value)", "torch.tensor([self.constant_value] * 32)")
    with pytest.raises(Exception, match="0-d numbers only|not supported"):
        capture(Problem("vector_const", src), method="export")


KLDIV = '''import torch

batch_size = 8192 * 2
input_shape = (8192 * 2,)


class Model(torch.nn.Module):
    def forward(self, predictions, targets):
        return torch.nn.functional.kl_div(torch.log(predictions), targets, reduction="batchmean")


def get_inputs():
    return [torch.rand(batch_size, *input_shape).softmax(dim=-1), torch.rand(batch_size, *input_shape).softmax(dim=-1)]


def get_init_inputs():
    return []
'''


def test_size_read_as_a_number_is_a_runtime_scalar():
    # 98_KLDivLoss, once its derived small instance exists: batchmean divides by the batch size, found
    # as a dimension (Sym), which the kernel emitters took for a literal and failed on
    p = Problem("kldiv_batchmean", KLDIV)
    g = capture(p)
    divs = [a for n in g.nodes if n.op == "div" for a in n.args if isinstance(a, Dyn)]
    assert divs and divs[0].expr == "predictions.shape[0]" and int(divs[0]) == 16384
    _judge(p)


EXCLUSIVE = '''import torch

batch_size = 16
input_shape = (64,)
dim = 1
SMALL = {"batch_size": 4, "input_shape": (8,)}


class Model(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        c = torch.cumsum(x.narrow(dim=self.dim, start=0, length=x.size(self.dim) - 1), dim=self.dim)
        return torch.cat((torch.zeros_like(x.select(self.dim, 0).unsqueeze(self.dim)), c), dim=self.dim)


def get_inputs():
    return [torch.rand(batch_size, *input_shape)]


def get_init_inputs():
    return [dim]
'''


def test_size_minus_one_is_a_runtime_size():
    # 92_cumsum_exclusive, once input_shape shrinks: narrow(length=x.size(1) - 1) baked the full size's
    # 63 (the seed was right at full size only)
    p = Problem("exclusive_scan", EXCLUSIVE)
    g = capture(p)
    assert not any("SMALL capture failed" in n for n in g.notes), g.notes
    ends = [a for n in g.nodes if n.op == "slice.Tensor" for a in n.args if isinstance(a, Dyn)]
    assert [d.expr for d in ends] == ["(x.shape[1] - 1)"] and int(ends[0]) == 63
    _judge(p)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["TRIL", "SDPA"] + [pytest.param(n, marks=pytest.mark.gpu_slow)  # the rest with tests-slow
                                                     for n in ("POOL", "CONST", "KLDIV", "EXCLUSIVE")])
def test_fixed_seeds_on_gpu_at_full_size(name):
    # the full size is what the captured graph holds: the GPU path runs it as captured
    p = Problem(name.lower(), globals()[name])
    res = sandbox.evaluate(p, build(p).source, small=False, device="cuda", trials=3, timing=False)
    assert res["status"] == "correct", f"{res['status']}: {res['error_text']}"
    assert res["library_only"] is False
