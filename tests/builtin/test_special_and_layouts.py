"""Scan / gather / pooling templates, the tiled (transpose) pointwise kernel, strided reductions
(INNER), online softmax, and the seed's GEMM rules (split-K, tf32x3), in the Triton interpreter.

Kernels that a launcher chooses per call are spied on (the module's kernel object is wrapped), so a
test fails when the launcher falls back to another path, not only when numbers are wrong.
"""

from __future__ import annotations

import pytest
import torch

from kernellab.agents.builtin import ReductionMode, SetConfig, build, built
from kernellab.compiler.codegen import auto_split_k, default_precision, tf32x3_ok
from kernellab.problem import Problem

DEV = "cuda" if torch.cuda.is_available() else "cpu"
_NAME = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}


def problem(forward: str, dtype: torch.dtype, inputs: str, init: str = "", consts: str = "",
            extra: str = "") -> Problem:
    src = f"""import torch

DTYPE = {_NAME[dtype]!r}
{consts}


class Model(torch.nn.Module):
    def __init__(self{', ' + init if init else ''}):
        super().__init__()
{extra or '        pass'}

    def forward(self, *xs):
        {forward}


def get_inputs():
    return {inputs}


def get_init_inputs():
    return [{init}] if {bool(init)!r} else []
"""
    return Problem(name="t", source=src)


class Spy:
    """Wraps a launched kernel object: records the constexpr keywords of every launch."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, []

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.calls.append(kw)
            return self.kernel[grid](*args, **kw)
        return launch


def check(load, close, p: Problem, cases: list[list], dtype, actions=(), spy: str | None = None, init=(),
          atol=None, rtol=None) -> list[dict]:
    code = build(p, actions)
    assert code.meta["kernels"] >= 1, code.meta["groups"]
    mod = load(code.source)
    calls = []
    if spy:
        s = Spy(getattr(mod, spy))
        setattr(mod, spy, s)
        calls = s.calls
    for inputs in cases:
        torch.manual_seed(0)
        ref = mod.Model(*init).to(DEV).eval()
        torch.manual_seed(0)  # the same weights in both
        new = mod.ModelNew(*init).to(DEV).eval()
        xs = [(x.to(dtype) if x.is_floating_point() else x).to(DEV) for x in inputs]
        if any(p.is_floating_point() for p in ref.parameters()):
            ref, new = ref.to(dtype), new.to(dtype)
        with torch.no_grad():
            close(new(*xs), ref(*xs), dtype, atol, rtol)
    return calls


# -- scan ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cumsum_last_and_middle_dim(load, close, dtype):
    p = problem("return torch.cumsum(xs[0], dim=-1), torch.cumsum(xs[0], dim=1) * 2.0", dtype,
                "[torch.randn(2, 5, 33)]")
    gids = [g.id for g in built(p).groups if g.kind == "special"]
    assert len(gids) == 2
    # chunks of 16 columns: a row of 127 takes 8 trips, so the carry between chunks is exercised
    acts = [SetConfig(g, (("BLOCK_R", 16),)) for g in gids]
    cases = [[torch.randn(*s)] for s in [(1, 1, 1), (2, 3, 127), (1, 17, 129)]]
    tol = (2e-4, 1e-4) if dtype == torch.float32 else (None, None)  # 16-column chunks reorder the sum
    check(load, close, p, cases, dtype, acts, atol=tol[0], rtol=tol[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cumprod_carries_a_product_between_chunks(load, close, dtype):
    p = problem("return torch.cumprod(xs[0], dim=-1), torch.cumprod(xs[0], dim=1)", dtype, "[torch.randn(2, 5, 33)]")
    gids = [g.id for g in built(p).groups if g.kind == "special"]
    assert len(gids) == 2
    acts = [SetConfig(g, (("BLOCK_R", 16),)) for g in gids]  # 8 chunks in a row of 127: the carry is a product
    # factors near 1 keep the products in range over 129 columns, signs flip them
    cases = [[(torch.rand(*s) * 0.4 + 0.8) * torch.sign(torch.randn(*s))] for s in [(1, 1, 1), (2, 3, 127), (1, 17, 129)]]
    check(load, close, p, cases, dtype, acts)


# -- gather --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_gather(load, close, dtype):
    p = problem("return self.embed(xs[0])", dtype, "[torch.randint(0, v, (2, 7))]", init="v, h",
                consts="v = 11\nh = 9", extra="        self.embed = torch.nn.Embedding(v, h)")
    assert [g.kind for g in built(p).groups] == ["special"]
    for v, h, shape in [(11, 9, (2, 7)), (127, 65, (3, 33)), (1, 1, (1,)), (5, 129, (4,))]:
        check(load, close, p, [[torch.randint(0, v, shape)]], dtype, init=(v, h))


# -- pooling -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pool", ["k3s2p1", "k2s2", "k3s2ceil"])
def test_max_pool2d(load, close, dtype, pool):
    kw = {"k3s2p1": "3, stride=2, padding=1", "k2s2": "2, stride=2",
          "k3s2ceil": "3, stride=2, padding=1, ceil_mode=True"}[pool]
    p = problem(f"return torch.nn.functional.max_pool2d(xs[0], {kw})", dtype, "[torch.randn(2, 3, 9, 9)]")
    assert [g.kind for g in built(p).groups] == ["special"]
    cases = [[torch.randn(*s)] for s in [(1, 1, 2, 2), (2, 3, 17, 33), (1, 2, 8, 5)]]
    check(load, close, p, cases, dtype)


POOLS = {
    "max3d": ("max_pool3d(xs[0], 3, stride=2, padding=1)", (2, 3, 5, 9, 9)),
    "max3d_ceil_dil": ("max_pool3d(xs[0], 2, stride=2, padding=1, dilation=2, ceil_mode=True)", (1, 2, 6, 7, 8)),
    "avg1d": ("avg_pool1d(xs[0], 8, stride=1, padding=4)", (2, 3, 41)),  # KernelBench 44's pool
    "avg2d_ceil_nopad": ("avg_pool2d(xs[0], 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)", (2, 3, 10, 9)),
    "avg2d_divisor": ("avg_pool2d(xs[0], (2, 3), stride=(1, 2), padding=(1, 1), divisor_override=5)", (1, 2, 7, 8)),
    "avg3d": ("avg_pool3d(xs[0], 3, stride=2, padding=1)", (2, 3, 6, 9, 10)),  # KernelBench 46's
    "avg3d_ceil": ("avg_pool3d(xs[0], 3, stride=2, padding=1, ceil_mode=True)", (1, 2, 6, 8, 7)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_max_and_average_pools_of_one_to_three_dims(load, close, dtype, pool):
    call, shape = POOLS[pool]
    if dtype == torch.bfloat16 and "avg_pool3d" in call and DEV == "cpu":
        pytest.skip("PyTorch's CPU avg_pool3d (the reference) has no bfloat16")
    p = problem(f"return torch.nn.functional.{call}", dtype, f"[torch.randn{shape}]")
    assert "special" in [g.kind for g in built(p).groups]  # not PyTorch's pool
    assert "torch.nn.functional" not in build(p).source.split("class ModelNew")[1]
    smaller = (*shape[:-1], shape[-1] - 3)
    # the model at the file's size, a smaller one, and without the batch dim (a pool takes both)
    check(load, close, p, [[torch.randn(*shape)], [torch.randn(*smaller)], [torch.randn(*shape[1:])]], dtype)


# -- argmax / argmin ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_arg_extremes_take_the_first_index_and_nan(load, close, dtype, op):
    p = problem(f"x = xs[0]\n        return torch.{op}(x, dim=1), torch.{op}(x, dim=-1, keepdim=True), torch.{op}(x)", dtype,
                "[torch.randn(3, 70, 33)]")
    assert [g.kind for g in built(p).groups] == ["special"] * 3
    mod = load(build(p, [SetConfig(g.id, (("TILE", 64), ("BLOCK_I", 16))) for g in built(p).groups]).source)
    x = torch.randn(3, 70, 33)
    x[0, 5:9, 2] = 7.0  # ties: the first index wins
    x[1, :, 3] = 0.0
    x[2, 40, 4] = x[2, 50, 4] = float("nan")  # NaN is the extreme, its first index wins
    x[0, 66, 3] = float("inf")
    x[1, 2, 5] = float("-inf")
    cases = [x, torch.randn(2, 1, 1), torch.randint(-2, 3, (2, 130, 17)).float()]  # small ints: many ties
    for xi in cases:
        xi = xi.to(dtype)
        want, got = mod.Model()(xi), mod.ModelNew()(xi)
        for w, g in zip(want, got, strict=True):
            assert g.dtype == torch.int64 and g.shape == w.shape and torch.equal(g, w), (op, xi.shape, w, g)


# -- vector norms -------------------------------------------------------------------------------------

NORMS = {
    "frobenius": "x / torch.norm(x, p='fro')",  # KernelBench 37's
    "l2_dim1": "x / torch.norm(x, p=2, dim=1, keepdim=True)",  # 39's
    "l1_last": "torch.linalg.vector_norm(x, ord=1, dim=-1)",
    "inf_01": "torch.linalg.vector_norm(x, ord=float('inf'), dim=(0, 1))",
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", sorted(NORMS))
def test_vector_norms_are_our_reductions(load, close, dtype, norm):
    p = problem(f"x = xs[0]\n        return {NORMS[norm]}", dtype, "[torch.randn(4, 33, 65)]")
    assert all(g.kind != "torch" for g in built(p).groups), [(g.id, g.kind) for g in built(p).groups]
    check(load, close, p, [[torch.randn(4, 33, 65)], [torch.randn(2, 5, 130)]], dtype)


# -- tiled pointwise (transpose) ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_transpose_uses_the_tiled_kernel(load, close, dtype):
    p = problem("return xs[0].transpose(1, 2).contiguous() * 2.0 + 1.0", dtype, "[torch.randn(2, 8, 6)]")
    gid = next(g.id for g in built(p).groups if g.kind == "pointwise")
    acts = [SetConfig(gid, (("TILE_2D", 16),))]
    cases = [[torch.randn(*s)] for s in [(1, 2, 3), (2, 33, 127), (3, 17, 16)]]
    calls = check(load, close, p, cases, dtype, acts, spy=f"k_{gid}_2d")
    assert len(calls) == len(cases)


def test_contiguous_input_keeps_the_flat_kernel(load, close):
    p = problem("return xs[0] * 2.0 + 1.0", torch.float32, "[torch.randn(2, 8, 6)]")
    gid = next(g.id for g in built(p).groups if g.kind == "pointwise")
    calls = check(load, close, p, [[torch.randn(2, 33, 7)]], torch.float32, spy=f"k_{gid}_2d")
    assert calls == []


# -- strided reductions (INNER) and online softmax ------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_sum_over_the_middle_dim_reads_along_the_contiguous_dim(load, close, dtype):
    p = problem("return xs[0].sum(dim=1), xs[0].mean(dim=1) * 3.0", dtype, "[torch.randn(3, 33, 127)]")
    gid = next(g.id for g in built(p).groups if g.kind == "rows")
    acts = [SetConfig(gid, (("INNER_ROWS", 32), ("TILE", 256)))]  # 8 rows of R per trip: several trips
    cases = [[torch.randn(*s)] for s in [(1, 2, 2), (3, 33, 127), (2, 129, 1), (1, 17, 65)]]
    calls = check(load, close, p, cases, dtype, acts, spy=f"k_{gid}_loop",
                  atol=2e-4 if dtype == torch.float32 else None)
    # (2, 129, 1): the kept inner dim has size 1, nothing to coalesce along: the one-pass rows kernel
    assert [c["INNER"] for c in calls] == [True, True, True], calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_online_softmax_over_chunks(load, close, dtype, op):
    p = problem(f"return torch.{op}(xs[0] * 0.5, dim=-1) + 1.0", dtype, "[torch.randn(4, 64)]")
    gid = next(g.id for g in built(p).groups if g.kind == "rows")
    acts = [ReductionMode(gid, "multi_pass"), SetConfig(gid, (("BLOCK_R", 32),))]
    code = build(p, acts)
    # max and sum in one loop: a loop for the statistics and one for the output, not three
    kernel = code.source.split(f"def k_{gid}_loop(")[1].split("def launch_")[0]
    assert kernel.count("for start in range(0, R, BLOCK_R)") == 2 and "acc_" in kernel
    big = torch.randn(3, 129) * 30  # wide range: the running max changes between chunks
    big[1, 100:] += 200.0
    cases = [[torch.randn(1, 1)], [torch.randn(5, 127)], [big]]
    check(load, close, p, cases, dtype, acts, atol=2e-4 if dtype == torch.float32 else None)


# -- the seed's GEMM rules -------------------------------------------------------------------------------

def test_split_k_rule():
    def group(m, k, n):
        p = problem("return xs[0] @ xs[1]", torch.float32, f"[torch.randn({m}, {k}), torch.randn({k}, {n})]")
        b = built(p)
        return b.graph, next(g for g in b.groups if g.kind == "gemm")
    assert auto_split_k(*group(1024, 65536, 1024)) == 4  # 64 tiles: 4 splits fill 132 SMs
    assert auto_split_k(*group(4096, 4096, 4096)) == 1  # 1024 tiles already
    assert auto_split_k(*group(1024, 2048, 1024)) == 1  # too little K to split
    assert auto_split_k(*group(128, 65536, 128)) == 16  # capped


def test_tf32x3_rule():
    # two inputs: the error grows with sqrt(K); 1e-4 admits K <= 277
    assert tf32x3_ok("float32", 1e-4, 1e-4, 256, reads_weight=False)
    assert not tf32x3_ok("float32", 1e-4, 1e-4, 512, reads_weight=False)
    assert tf32x3_ok("float32", 1e-3, 1e-3, 4096, reads_weight=False)
    # a weight keeps the output's scale whatever K
    assert tf32x3_ok("float32", 1e-4, 1e-4, 8192, reads_weight=True)
    assert not tf32x3_ok("bfloat16", 1e-2, 1e-2, 64, reads_weight=True)


@pytest.mark.parametrize("body,inputs,init,extra,want", [
    ("return xs[0] @ xs[1]", "[torch.randn(64, 4096), torch.randn(4096, 64)]", "", "", "ieee"),
    ("return xs[0] @ xs[1]", "[torch.randn(64, 128), torch.randn(128, 64)]", "", "", "tf32x3"),
    ("return self.fc(xs[0])", "[torch.randn(64, 4096)]", "", "        self.fc = torch.nn.Linear(4096, 64)", "tf32x3"),
])
def test_seed_precision(body, inputs, init, extra, want):
    p = problem(body, torch.float32, inputs, init=init, extra=extra)
    b = built(p)
    grp = next(g for g in b.groups if g.kind == "gemm")
    assert default_precision(b.graph, grp, p.settings()) == want
    assert f'input_precision="{want}"' in build(p).source
