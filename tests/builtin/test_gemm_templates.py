"""GEMM templates (kernellab/compiler/kernels/gemm.py) against PyTorch: odd shapes, batched/not, trans_b/not, every
dtype, every operand kind, every row reduction, split-K and persistent variants. CPU: Triton interpreter
with tiny tiles so that masks, several tiles per row and the ticket fixups are all exercised."""

from __future__ import annotations

import math
import types

import pytest
import torch

try:
    import kernellab.compiler.kernels.gemm as G
except ImportError:  # a GPU host without the package's other dependencies: gemm.py and its siblings stand alone
    import importlib.util
    import sys
    from pathlib import Path

    _kernels = Path(__file__).resolve().parents[2] / "kernellab" / "compiler" / "kernels"
    _pkg = types.ModuleType("kl_kernels")
    _pkg.__path__ = [str(_kernels)]  # gemm.py's relative imports (template, gemm_launcher) resolve here
    sys.modules["kl_kernels"] = _pkg
    _s = importlib.util.spec_from_file_location("kl_kernels.gemm", _kernels / "gemm.py")
    G = importlib.util.module_from_spec(_s)
    sys.modules["kl_kernels.gemm"] = G
    _s.loader.exec_module(G)

ROW_REDUCTIONS, VECTOR_REDUCTIONS = G.ROW_REDUCTIONS, G.VECTOR_REDUCTIONS
GemmSpec, KernelSource, Operand, gemm_kernel, load_kernel = G.GemmSpec, G.KernelSource, G.Operand, G.gemm_kernel, G.load_kernel

# numpy warns about -inf/NaN arithmetic in masked-off lanes (columns >= N, rows >= M) that are never stored
# (and Triton 3.6's interpreter converts 1-element arrays to ints, deprecated in numpy; pinned < 2.3)
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")]

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DT = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# (dtype, atol, rtol): fp32 keeps fp32 accuracy (IEEE dot); half types round the output once
TOL = {"float32": (2e-5, 2e-5), "float16": (1e-2, 1e-2), "bfloat16": (3e-2, 2e-2)}
SMALL_TILES = dict(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=2, num_warps=4, num_stages=2)

# torch stand-ins for the tl functions an epilogue may call, so one text serves kernel and reference
_TL = types.SimpleNamespace(
    erf=torch.erf, exp=torch.exp, log=torch.log, sqrt=torch.sqrt, where=torch.where,
    sigmoid=torch.sigmoid, maximum=torch.maximum, minimum=torch.minimum, abs=torch.abs,
)


def _run_text(text: str, acc: torch.Tensor, env: dict) -> torch.Tensor:
    scope = {"tl": _TL, **env, "acc": acc}
    exec(text, {}, scope)
    return scope["acc"]


def assert_close(out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> None:
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    o, r = out.float().cpu(), ref.float().cpu()
    bad = ~torch.isclose(o, r, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        vals = [(tuple(i), o[tuple(i)].item(), r[tuple(i)].item()) for i in idx]
        nan = torch.isnan(o) & ~torch.isnan(r)
        raise AssertionError(
            f"{int(bad.sum())}/{bad.numel()} mismatched (atol={atol}, rtol={rtol}); max abs err "
            f"{(o - r).abs().nan_to_num(float('inf')).max().item():.3g}; first (index, got, want): {vals}; "
            f"NaN where reference has none: {nan.nonzero()[:5].tolist()}"
        )


_cache: dict[GemmSpec, object] = {}


def launcher(spec: GemmSpec):
    if spec not in _cache:
        _cache[spec] = load_kernel(gemm_kernel(spec))
    return _cache[spec]


def make_inputs(spec: GemmSpec, M: int, N: int, K: int, B: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    dt = DT[spec.dtype]
    s = max(K, 1) ** -0.25  # products of two such entries sum to O(1) over K

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * s).to(dt).to(DEV)

    lead = (B,) if spec.batched else ()
    a = rnd(*lead, M, K)
    b = rnd(*lead, N, K) if spec.trans_b else rnd(*lead, K, N)
    extra = []
    for op in spec.operands:
        if op.kind == "row":
            extra.append(torch.randn(N, generator=g).to(dt).to(DEV))
        elif op.kind == "col":
            extra.append(torch.randn(*lead, M, generator=g).to(dt).to(DEV))
        elif op.kind == "matrix":
            extra.append(torch.randn(*lead, M, N, generator=g).to(dt).to(DEV))
        else:
            extra.append(0.75)
    return a, b, extra


def reference(spec: GemmSpec, a, b, extra, eps: float = 1e-5) -> torch.Tensor:
    bt = b.float().transpose(-1, -2) if spec.trans_b else b.float()
    acc = a.float() @ bt
    env, venv = {}, {}
    for op, t in zip(spec.operands, extra, strict=True):
        if op.kind == "col":
            env[op.name] = t.float().unsqueeze(-1)
            venv[op.name] = t.float()
        elif op.kind == "scalar":
            env[op.name] = venv[op.name] = float(t)
        else:
            env[op.name] = t.float()
    if spec.epilogue:
        acc = _run_text(spec.epilogue, acc, env)
    r = spec.row_reduction
    if r == "softmax":
        acc = torch.softmax(acc, -1)
    elif r == "log_softmax":
        acc = torch.log_softmax(acc, -1)
    elif r == "logsumexp":
        acc = torch.logsumexp(acc, -1)
    elif r == "sum":
        acc = acc.sum(-1)
    elif r == "max":
        acc = acc.amax(-1)
    elif r == "layernorm":
        N = acc.shape[-1]
        acc = torch.nn.functional.layer_norm(acc, (N,), env.get("ln_weight"), env.get("ln_bias"), eps)
    if spec.row_epilogue:
        acc = _run_text(spec.row_epilogue, acc, venv if r in VECTOR_REDUCTIONS else env)
    return acc


def check(spec: GemmSpec, M: int, N: int, K: int, config: dict | None = None, B: int = 2, seed: int = 0):
    a, b, extra = make_inputs(spec, M, N, K, B, seed)
    out = launcher(spec)(a, b, *extra, config=config if config is not None else SMALL_TILES)
    assert out.dtype == DT[spec.dtype]
    atol, rtol = TOL[spec.dtype]
    assert_close(out, reference(spec, a, b, extra, (config or {}).get("eps", 1e-5)), atol, rtol)
    return out


# ------------------------------------------------------------------------------ plain GEMM


@pytest.mark.parametrize("M, N, K", [(1, 1, 1), (17, 33, 127), (127, 17, 33), (33, 127, 17)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_plain_gemm(M, N, K, dtype, trans_b):
    check(GemmSpec("mm", trans_b=trans_b, dtype=dtype), M, N, K)


@pytest.mark.parametrize("M, N, K", [(1, 17, 16), (33, 17, 127)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_batched_gemm(M, N, K, dtype, trans_b):
    check(GemmSpec("bmm", batched=True, trans_b=trans_b, dtype=dtype), M, N, K)


@pytest.mark.parametrize("batched", [False, True])
def test_default_config_runs(batched):
    spec = GemmSpec("mm_default", batched=batched, trans_b=True, dtype="bfloat16")
    check(spec, 33, 17, 64, config={})  # default tiles, clamped to the small problem


# ------------------------------------------------------------------------------ epilogue operands

OPS = {
    "row": ((Operand("bias", "row"),), "acc = acc + bias"),
    "col": ((Operand("rs", "col"),), "acc = acc * rs"),
    "matrix": ((Operand("res", "matrix"),), "acc = acc + 2.0 * res"),
    "scalar": ((Operand("scale", "scalar"),), "acc = acc * scale"),
    "gelu_all": (
        (Operand("bias", "row"), Operand("rs", "col"), Operand("res", "matrix"), Operand("scale", "scalar")),
        "acc = acc + bias\nacc = 0.5 * acc * (1.0 + tl.erf(acc * 0.7071067811865476))\nacc = (acc * rs + res) * scale",
    ),
}


@pytest.mark.parametrize("kind", list(OPS))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("batched", [False, True])
def test_epilogue_operands(kind, dtype, batched):
    ops, epi = OPS[kind]
    spec = GemmSpec(f"epi_{kind}", batched=batched, trans_b=True, dtype=dtype, operands=ops, epilogue=epi)
    check(spec, 17, 33, 40)


def test_operand_broadcast_forms():
    """A [1, N] bias, a keepdim [M, 1] column and a non-contiguous residual are accepted."""
    spec = GemmSpec("epi_forms", operands=OPS["gelu_all"][0], epilogue=OPS["gelu_all"][1])
    a, b, (bias, rs, res, scale) = make_inputs(spec, 17, 33, 20)
    res_t = res.t().contiguous().t()  # same values, column-major
    out = launcher(spec)(a, b, bias[None, :], rs[:, None], res_t, scale, config=SMALL_TILES)
    assert_close(out, reference(spec, a, b, [bias, rs, res, scale]), *TOL["float32"])


# ------------------------------------------------------------------------------ row reductions

# (N, BLOCK_N): BLOCK_N >= N keeps the row in one tile; BLOCK_N < N goes through the ticket fixup
ROW_CASES = [(1, 16), (17, 32), (33, 16), (127, 32)]
LN_OPS = (Operand("bias", "row"), Operand("ln_weight", "row"), Operand("ln_bias", "row"))


def _row_spec(red: str, dtype: str, batched: bool, with_epilogues: bool = True) -> GemmSpec:
    ops = (Operand("bias", "row"), Operand("scale", "scalar"), Operand("rs", "col"))
    if red == "layernorm":
        ops = ops + LN_OPS[1:]
    row_epi = ""
    if with_epilogues:
        row_epi = "acc = acc * scale + rs" if red in VECTOR_REDUCTIONS else "acc = acc * rs + bias"
    return GemmSpec(
        f"row_{red}", batched=batched, trans_b=True, dtype=dtype, operands=ops,
        epilogue="acc = (acc + bias) * scale" if with_epilogues else "",
        row_reduction=red, row_epilogue=row_epi,
    )


@pytest.mark.parametrize("red", [r for r in ROW_REDUCTIONS if r])
@pytest.mark.parametrize("N, block_n", ROW_CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_row_reduction(red, N, block_n, dtype):
    spec = _row_spec(red, dtype, batched=(N == 33))
    out = check(spec, 33, N, 24, config={**SMALL_TILES, "BLOCK_N": block_n})
    assert out.dim() == (2 if spec.batched else 1) + (red not in VECTOR_REDUCTIONS)


@pytest.mark.parametrize("red", ["softmax", "layernorm", "logsumexp"])
def test_row_reduction_fp16_plain(red):
    check(_row_spec(red, "float16", batched=False, with_epilogues=False), 17, 127, 33)


def test_layernorm_eps_and_no_affine():
    spec = GemmSpec("ln_plain", dtype="float32", row_reduction="layernorm")
    check(spec, 17, 33, 16, config={**SMALL_TILES, "eps": 0.5})


def test_softmax_large_logits_is_stable():
    """Logits in the hundreds: a naive exp overflows; max-subtraction across tiles must not."""
    spec = GemmSpec("sm_big", trans_b=True, operands=(Operand("scale", "scalar"),),
                    epilogue="acc = acc * scale", row_reduction="softmax")
    a, b, _ = make_inputs(spec, 17, 65, 32)
    out = launcher(spec)(a, b, 300.0, config=SMALL_TILES)
    assert_close(out, torch.softmax((a @ b.T) * 300.0, -1), *TOL["float32"])


def test_ticket_counters_reset_between_calls():
    spec = _row_spec("softmax", "float32", batched=True)
    fn = launcher(spec)
    for seed in range(3):  # a stale counter would make a wrong tile normalise (or none at all)
        check(spec, 33, 50, 16, seed=seed)
    assert all(int(c.abs().sum()) == 0 for c in fn._counters.values())


# ------------------------------------------------------------------------------ variants


@pytest.mark.parametrize("split_k", [2, 3, 4])
@pytest.mark.parametrize("dtype, batched", [("float32", False), ("bfloat16", True)])
def test_split_k(split_k, dtype, batched):
    ops, epi = OPS["gelu_all"]
    spec = GemmSpec("mm_splitk", batched=batched, trans_b=False, dtype=dtype, operands=ops, epilogue=epi,
                    split_k=split_k)
    check(spec, 17, 33, 127, config={**SMALL_TILES, "SPLIT_K": split_k})


@pytest.mark.parametrize("red", [None, "softmax", "sum"])
@pytest.mark.parametrize("batched", [False, True])
def test_persistent(red, batched):
    spec = GemmSpec(f"pers_{red}", batched=batched, trans_b=True, dtype="float32", persistent=True,
                    operands=(Operand("bias", "row"),), epilogue="acc = acc + bias", row_reduction=red)
    check(spec, 33, 50, 20)  # 3 programs walk 2 x 3 x 4 tiles


def test_persistent_split_k():
    spec = GemmSpec("pers_splitk", dtype="float32", persistent=True, split_k=2)
    check(spec, 17, 17, 100, config={**SMALL_TILES, "SPLIT_K": 3})


def test_out_argument_and_noncontiguous_a():
    spec = GemmSpec("mm_out", trans_b=True)
    a, b, _ = make_inputs(spec, 33, 17, 20)
    a_nc = a.t().contiguous().t()
    out = torch.full((33, 17), float("nan"), device=DEV)
    got = launcher(spec)(a_nc, b, out=out, config=SMALL_TILES)
    assert got is out
    assert_close(out, a @ b.T, *TOL["float32"])


def test_batch_broadcast_of_b():
    spec = GemmSpec("bmm_bcast", batched=True)
    a, _, _ = make_inputs(spec, 17, 33, 20, B=3)
    b = torch.randn(1, 20, 33, device=DEV)
    out = launcher(spec)(a, b, config=SMALL_TILES)
    assert_close(out, a @ b, *TOL["float32"])


# ------------------------------------------------------------------------------ source, config, space


def test_source_contract():
    spec = GemmSpec("lin", trans_b=True, dtype="bfloat16", operands=(Operand("bias", "row"),),
                    epilogue="acc = acc + bias", split_k=4)
    ks = gemm_kernel(spec)
    assert isinstance(ks, KernelSource) and ks.name == "lin"
    assert "@triton.jit" in ks.kernel_src and "def lin_kernel(" in ks.kernel_src
    assert ks.launcher_src.startswith("def launch_lin(a, b, *extra, out=None, config=None):")
    assert "BLOCK_M: tl.constexpr" in ks.kernel_src and "GROUP_M: tl.constexpr" in ks.kernel_src
    assert set(ks.config) - {"eps", "NUM_PROGS"} <= set(ks.space)
    assert math.prod(len(v) for v in ks.space.values()) >= 100
    assert all(ks.config[k] in ks.space[k] for k in ks.space)
    assert ks.config["SPLIT_K"] == 4


@pytest.mark.parametrize("allow_tf32, prec, want", [(False, None, "ieee"), (True, None, "tf32"),
                                                    (False, "tf32x3", "tf32x3")])
def test_fp32_dot_precision(allow_tf32, prec, want):
    src = gemm_kernel(GemmSpec("p", allow_tf32=allow_tf32, fp32_precision=prec)).kernel_src
    assert f'input_precision="{want}"' in src
    assert "input_precision" not in gemm_kernel(GemmSpec("h", dtype="float16")).kernel_src  # tensor cores


@pytest.mark.parametrize(
    "spec, match",
    [
        (GemmSpec("bad name"), "identifier"),
        (GemmSpec("x", dtype="float64"), "dtype"),
        (GemmSpec("x", row_reduction="median"), "row_reduction"),
        (GemmSpec("x", operands=(Operand("b", "tensor"),)), "kind"),
        (GemmSpec("x", operands=(Operand("acc", "row"),)), "free identifier"),
        (GemmSpec("x", operands=(Operand("u", "row"), Operand("u", "col"))), "twice"),
        (GemmSpec("x", epilogue="acc = = 1"), "epilogue"),
        (GemmSpec("x", split_k=2, row_reduction="softmax"), "split_k"),
        (GemmSpec("x", row_epilogue="acc = acc * 2"), "needs a row_reduction"),
        (GemmSpec("x", operands=(Operand("bias", "row"),), row_reduction="sum", row_epilogue="acc = acc + bias"),
         "one value per row"),
        (GemmSpec("x", operands=(Operand("ln_weight", "col"),), row_reduction="layernorm"), "ln_weight"),
    ],
)
def test_bad_spec(spec, match):
    with pytest.raises((ValueError, TypeError), match=match):
        gemm_kernel(spec)


def test_bad_inputs_have_clear_errors():
    spec = GemmSpec("chk", trans_b=True, operands=(Operand("bias", "row"),), epilogue="acc = acc + bias")
    fn = launcher(spec)
    a, b, (bias,) = make_inputs(spec, 17, 33, 20)
    with pytest.raises(ValueError, match="inner dimensions"):
        fn(a, b[:, :19], bias, config=SMALL_TILES)
    with pytest.raises(TypeError, match="dtype"):
        fn(a.double(), b, bias, config=SMALL_TILES)
    with pytest.raises(TypeError, match="expected 1 extra"):
        fn(a, b, config=SMALL_TILES)
    with pytest.raises(ValueError, match="does not broadcast"):
        fn(a, b, bias[:5], config=SMALL_TILES)
    with pytest.raises(ValueError, match="2-D"):
        fn(a[None], b, bias, config=SMALL_TILES)


# ------------------------------------------------------------------------------ compiled for sm_90, no GPU

# Run in a fresh process: under TRITON_INTERPRET=1 triton.language's own helpers are interpreter functions.
_AOT = r"""
import importlib.util, json, os, sys, types
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

gemm_path, spec_repr, one_tile, tmp = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
pkg = types.ModuleType("kl_kernels"); pkg.__path__ = [os.path.dirname(gemm_path)]; sys.modules["kl_kernels"] = pkg
ms = importlib.util.spec_from_file_location("kl_kernels.gemm", gemm_path)
G = importlib.util.module_from_spec(ms); sys.modules["kl_kernels.gemm"] = G; ms.loader.exec_module(G)
spec = eval(spec_repr, {"GemmSpec": G.GemmSpec, "Operand": G.Operand})
ks = G.gemm_kernel(spec)
path = f"{tmp}/aot_{spec.name}.py"
open(path, "w").write("import triton\nimport triton.language as tl\n\n" + ks.kernel_src)
ms = importlib.util.spec_from_file_location("aot_" + spec.name, path)
mod = importlib.util.module_from_spec(ms); ms.loader.exec_module(mod)
fn = getattr(mod, ks.kernel_name)
cfg = ks.config
meta = {"BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"], "BLOCK_K": cfg["BLOCK_K"], "GROUP_M": cfg["GROUP_M"],
        "SPLIT_K": cfg.get("SPLIT_K", 1), "EVEN_K": True, "ONE_N_TILE": one_tile, "EPS": 1e-5, "UPCAST_DOT": False}
# specialise integer arguments as a real launch would: unit strides -> 1, the others divisible by 16
ones = {"stride_ak", "stride_on", "stride_bk" if spec.trans_b else "stride_bn"}
ones |= {f"s_{op.name}_{'m' if op.kind == 'col' else 'n'}" for op in spec.operands}
elem = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}[spec.dtype]
sig, consts, attrs = {}, {}, {}
for i, n in enumerate(fn.arg_names):
    if n in meta or n in ones:
        sig[n], consts[(i,)] = "constexpr", meta.get(n, 1)
        continue
    if n.startswith("v_"):
        sig[n] = "fp32"
        continue
    sig[n] = ("*fp32" if n == "ws_ptr" else "*i32" if n == "cnt_ptr"
              else "*" + elem if n.endswith("_ptr") or n.startswith("p_") else "i32")
    if n not in ("M", "N", "K", "B"):
        attrs[(i,)] = [["tt.divisibility", 16]]
k = triton.compile(ASTSource(fn, sig, constexprs=consts, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
ttgir = k.asm["ttgir"]
print(json.dumps({"shared": k.metadata.shared, "pipelined": "async_copy_global_to_local" in ttgir,
                  "wgmma": "warp_group_dot" in ttgir}))
"""


def _compile_sm90(spec: GemmSpec, tmp_path, one_tile: bool = False) -> dict:
    """Compile the default-config kernel for an H100/H200 (sm_90) with the bundled ptxas, no GPU needed:
    catches the Triton type errors, lost pipelining and shared-memory overflows the interpreter cannot see."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run(
        [sys.executable, "-c", _AOT, G.__file__, repr(spec), "1" if one_tile else "0", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env,
    )
    if p.returncode != 0:
        if "No module named" in p.stderr or "ptxas" in p.stderr and "not found" in p.stderr:
            pytest.skip(f"cannot compile for sm_90 here: {p.stderr.strip().splitlines()[-1]}")
        raise AssertionError(f"sm_90 compile of {spec.name} failed:\n{p.stderr[-4000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "spec, one_tile",
    [
        (GemmSpec("aot_epi_splitk", trans_b=True, dtype="bfloat16", operands=OPS["gelu_all"][0],
                  epilogue=OPS["gelu_all"][1], split_k=4), False),
        (GemmSpec("aot_sm_pers", trans_b=True, dtype="bfloat16", operands=(Operand("bias", "row"),),
                  epilogue="acc = acc + bias", row_reduction="softmax", row_epilogue="acc = acc * bias",
                  persistent=True), False),
        (GemmSpec("aot_ln_fp32", trans_b=True, dtype="float32", fp32_precision="tf32x3",
                  operands=LN_OPS, epilogue="acc = acc + bias", row_reduction="layernorm"), False),
        (GemmSpec("aot_lse_one", dtype="float16", row_reduction="logsumexp"), True),
    ],
    ids=lambda v: v.name if isinstance(v, GemmSpec) else str(v),
)
def test_compiles_for_sm90(spec, one_tile, tmp_path):
    k = _compile_sm90(spec, tmp_path, one_tile)
    assert k["shared"] <= 227 * 1024, f"{k['shared']} B of shared memory > the H100/H200 limit"
    assert k["pipelined"], "the K loop was not software-pipelined"
    assert k["wgmma"], "expected the Hopper tensor-core dot (wgmma)"


# ------------------------------------------------------------------------------ GPU (real tiles)


# 42 compilations: every GPU call runs each reduction once, at a ragged N, persistent and not alternating; the
# full grid runs with tests-slow
_REDS = [None, "softmax", "log_softmax", "logsumexp", "layernorm", "sum", "max"]
_TILES = [pytest.param(red, n, pers, marks=() if (n == 2049 and pers == (i % 2 == 1)) else pytest.mark.gpu_slow)
          for pers in (False, True) for n in (511, 1024, 2049) for i, red in enumerate(_REDS)]


@pytest.mark.gpu
@pytest.mark.parametrize("red, N, persistent", _TILES)
def test_gpu_default_tiles(red, N, persistent):
    spec = _row_spec(red, "bfloat16", batched=False) if red else GemmSpec(
        "gpu_lin", trans_b=True, dtype="bfloat16", operands=OPS["gelu_all"][0], epilogue=OPS["gelu_all"][1])
    spec = GemmSpec(**{**spec.__dict__, "name": f"gpu_{red}_{int(persistent)}", "persistent": persistent})
    for seed in range(2):
        check(spec, 1000, N, 777, config={}, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("prec, atol", [("ieee", 1e-4), ("tf32x3", 1e-4)])
def test_gpu_fp32_accuracy(prec, atol):
    spec = GemmSpec(f"gpu_fp32_{prec}", dtype="float32", fp32_precision=prec)
    a, b, _ = make_inputs(spec, 1024, 1024, 4096)
    out = launcher(spec)(a, b, config={})
    ref = (a.double() @ b.double()).float()
    assert_close(out, ref, atol, 1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize("split_k", [2, 8])
def test_gpu_split_k(split_k):
    spec = GemmSpec(f"gpu_splitk{split_k}", dtype="bfloat16", trans_b=True, split_k=split_k,
                    operands=OPS["row"][0], epilogue=OPS["row"][1])
    check(spec, 64, 512, 8192, config={})
