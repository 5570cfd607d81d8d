"""Write the candidate file (README.md "A problem, a candidate") for a partitioned graph.

Layout of a generated file: a docstring (groups, actions, what PyTorch still runs, the numerics
rule), the problem's source verbatim (``Model``, its constants), ``CONFIG``/``SPACE`` (one entry per
kernel group, read by the launchers at call time), shared helpers, then per group a ``@triton.jit``
kernel and its launcher, and ``class ModelNew(Model)`` whose ``forward`` calls the launchers in
execution order and leaves views and uncaptured ops to PyTorch.

Numerics rule (GEMMs): float32 problems use IEEE fp32 dot products unless the problem's tolerances
are at least ``TF32_MIN_TOL`` in both atol and rtol (what fp16/bf16 problems get by default), in
which case TF32 is allowed, or they admit 3xTF32 (``tf32x3_ok``: by K and by whether the GEMM reads
a weight); fp16/bf16 GEMMs accumulate in fp32. All pointwise and reduction math
runs in fp32 whatever the storage type.

Numerics rule (convs): the GEMM rule above (``conv_precision``) wherever the reference's conv is exact
fp32. On CUDA, PyTorch's fp32 conv is cuDNN in TF32 by default, and that TF32 output is the reference
(KernelBench's and ours): there a seed conv group (no Precision action) follows the reference at call
time as ``CONV_ON_TF32_REFERENCE`` says (``conv.py``'s module docstring has the mechanics).
"""

from __future__ import annotations

import math
import re
from typing import Any

import torch

from .ir import Dyn, Graph, Node, Ref, Sym
from .kernels.conv import ConvOperand, ConvSpec, conv_kernel
from .kernels.gemm import GemmSpec, Operand, gemm_kernel
from .kernels.loop_launcher import RUNTIME_HELPERS, SPLIT_MIN_CHUNK
from .kernels.loopgen import loop_kernel, split_reduction_ok
from .kernels.pointwise import HELPERS, emit_pw, literal, round_to
from .kernels.special import special_kernel, torch_expr
from .partition import Group

__all__ = ["generate", "TF32_MIN_TOL", "allow_tf32", "tf32x3_ok", "reads_weight", "default_precision", "conv_precision",
           "conv_cin_g", "auto_split_k", "auto_split_r", "few_long_rows", "SPLIT_MIN_R", "CONV_ON_TF32_REFERENCE"]

TF32_MIN_TOL = 1e-2

# What a seed conv group runs when, at call time, the reference's conv is cuDNN in TF32 (an fp32 CUDA
# tensor under the default flags): "cudnn" (cuDNN's conv, called as the reference calls it, + our kernel
# as its fused epilogue) or "tf32rn" (our conv with TF32 operands rounded as cuDNN rounds them). On the
# H200 our accurate fp32 convs (tf32x3, ieee) were judged incorrect against that reference at full size;
# "tf32rn" is not within 1e-4 of cuDNN's output everywhere (experiments/probes/conv_tf32.py, H200,
# 2026-12-01: 0 elements beyond on KernelBench 47 and 2, but 834 of 537M on 86, where cuDNN's
# depthwise conv sums in another order, and 224k of 1.8M on a small conv where cuDNN chose an exact
# fp32 algorithm), so the seed calls cuDNN. The planner still offers "tf32rn" as an action.
CONV_ON_TF32_REFERENCE = "cudnn"


def allow_tf32(dtype: str, atol: float, rtol: float) -> bool:
    """TF32 rounds GEMM inputs to 10 mantissa bits (~5e-4 relative per product): only problems whose
    tolerances already admit half-precision error may use it."""
    return dtype == "float32" and atol >= TF32_MIN_TOL and rtol >= TF32_MIN_TOL


# 3xTF32 (hi*hi + hi*lo + lo*hi on the tensor cores) differs from an fp32 GEMM by ~1.9e-7 of the
# output's spread (measured on the CPU with an exact emulation: error std / C std = 1.7e-7 at K=256,
# 1.9e-7 at K=512). The sandbox's ``mixed`` trial gives *inputs* magnitudes 1e-3..10, so a GEMM of two
# inputs has C std ~5.4 sqrt(K) and an error std ~1e-6 sqrt(K); outputs near 0 are then held to atol
# alone. Measured at atol = rtol = 1e-4: 0 of 4.2M outputs off at K=256, 20 of 4.2M at K=512. We admit
# tf32x3 when that error std is <= atol / 6 (K <= 277 at 1e-4). A GEMM that reads a parameter (an
# nn.Linear weight, ~U(+-1/sqrt(K))) has C std ~ rms(x) / sqrt(3) whatever K, far inside 1e-5.
TF32X3_ERR_PER_SQRT_K = 1.0e-6
TF32X3_SAFETY = 6.0


def tf32x3_ok(dtype: str, atol: float, rtol: float, k: int, reads_weight: bool) -> bool:
    """May an fp32 GEMM with inner size ``k`` use 3xTF32 under the problem's tolerances?"""
    if dtype != "float32" or rtol < 1e-5:
        return False
    if reads_weight:
        return atol >= 1e-5
    return TF32X3_ERR_PER_SQRT_K * math.sqrt(max(k, 1)) <= atol / TF32X3_SAFETY


def reads_weight(graph: Graph, gnode: Node) -> bool:
    return any(isinstance(a, Ref) and graph.view_base(a.name).kind == "param" for a in gnode.args[:2])


def default_precision(graph: Graph, grp: Group, settings: dict) -> str | None:
    """The seed's dot precision of a GEMM group: ``tf32`` when the tolerances admit TF32, else
    ``tf32x3`` when they admit it (it won 1.2-1.6x over IEEE fp32 on the H200 bench), else ``ieee``;
    None for half types (their dot is native)."""
    gnode = graph.node(grp.gemm)
    dtype = graph.node(gnode.args[0].name).dtype
    if dtype != "float32":
        return None
    if allow_tf32(dtype, settings["atol"], settings["rtol"]):
        return "tf32"
    k = graph.node(gnode.args[0].name).shape[-1]
    if tf32x3_ok(dtype, settings["atol"], settings["rtol"], int(k), reads_weight(graph, gnode)):
        return "tf32x3"
    return "ieee"


# -- rendering values in forward ------------------------------------------------------------------

def _render(a: Any) -> str:
    if isinstance(a, Ref):
        return a.name
    if isinstance(a, Dyn):
        return a.expr
    if isinstance(a, Sym):
        if not a.dims:
            return "1"
        return " * ".join(f"{a.name}.shape[{d}]" for d in a.dims) if len(a.dims) > 1 else f"{a.name}.shape[{a.dims[0]}]"
    if isinstance(a, list):
        return "[" + ", ".join(_render(x) for x in a) + "]"
    if isinstance(a, tuple):
        return "(" + ", ".join(_render(x) for x in a) + ("," if len(a) == 1 else "") + ")"
    if isinstance(a, torch.dtype):
        return str(a)
    if isinstance(a, torch.device):
        return "_dev"
    if isinstance(a, (torch.memory_format, torch.layout)):
        return str(a)
    if isinstance(a, float):
        return literal(a)
    return repr(a)


_TORCH_PW = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "neg": "(-{0})", "abs": "torch.abs({0})", "exp": "torch.exp({0})", "log": "torch.log({0})",
    "sqrt": "torch.sqrt({0})", "rsqrt": "torch.rsqrt({0})", "relu": "torch.relu({0})",
    "sigmoid": "torch.sigmoid({0})", "tanh": "torch.tanh({0})", "erf": "torch.erf({0})",
    "silu": "torch.nn.functional.silu({0})", "identity": "{0}.clone()", "maximum": "torch.maximum({0}, {1})",
    "minimum": "torch.minimum({0}, {1})", "where": "torch.where({0}, {1}, {2})", "pow": "torch.pow({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})",
    "gt": "({0} > {1})", "ge": "({0} >= {1})", "reciprocal": "torch.reciprocal({0})", "square": "({0} * {0})",
    "log1p": "torch.log1p({0})", "exp2": "torch.exp2({0})", "log2": "torch.log2({0})", "sin": "torch.sin({0})",
    "cos": "torch.cos({0})", "floor": "torch.floor({0})", "ceil": "torch.ceil({0})", "sign": "torch.sign({0})",
    "hardsigmoid": "torch.nn.functional.hardsigmoid({0})", "hardswish": "torch.nn.functional.hardswish({0})",
    "mish": "torch.nn.functional.mish({0})", "selu": "torch.selu({0})",
    "logical_not": "torch.logical_not({0})", "logical_and": "torch.logical_and({0}, {1})",
    "logical_or": "torch.logical_or({0}, {1})",
}


def _torch_node(n: Node) -> str:
    """A PyTorch expression for one IR node (views, uncaptured ops, and nodes sent back by actions)."""
    args = [_render(a) for a in n.args]
    if n.kind in ("view", "opaque"):
        packet, overload = n.op.split(".")
        kw = n.attrs.get("kwargs") or {}
        parts = args + [f"{k}={_render(v)}" for k, v in kw.items()]
        return f"torch.ops.aten.{packet}.{overload}({', '.join(parts)})"
    if n.kind == "getitem":
        return f"{args[0]}[{n.attrs['index']}]"
    if n.kind == "special":
        return torch_expr(n, args)
    if n.kind == "conv":
        a = n.attrs
        fn = f"torch.nn.functional.conv{'_transpose' if a['transposed'] else ''}{a['dims']}d"
        extra = f", output_padding={a['output_padding']}" if a["transposed"] else ""
        groups = a["groups"] or f"{args[0]}.shape[1] // {args[1]}.shape[1]"
        return (f"{fn}({args[0]}, {args[1]}, None, stride={a['stride']}, padding={a['padding']}{extra}, "
                f"groups={groups}, dilation={a['dilation']}).to(torch.{n.dtype})")
    if n.kind == "gemm":
        if n.op == "linear":
            return f"torch.nn.functional.linear({args[0]}, {args[1]})"
        return f"torch.{'bmm' if n.op == 'bmm' else 'matmul'}({args[0]}, {args[1]})"
    if n.kind == "reduce":
        dims, keep = list(n.attrs["dims"]), n.attrs["keepdim"]
        x = f"{args[0]}.float()"
        if n.op == "mean" and n.attrs.get("correction") is not None:
            e = f"torch.var({x}, dim={dims}, correction={n.attrs['correction']}, keepdim={keep})"
        else:
            fn = {"sum": "torch.sum", "mean": "torch.mean", "amax": "torch.amax", "amin": "torch.amin"}[n.op]
            e = f"{fn}({x}, dim={dims}, keepdim={keep})"
        return f"{e}.to(torch.{n.dtype})"
    if n.kind == "pw":
        if n.op == "gelu":
            e = f"torch.nn.functional.gelu({args[0]}, approximate={n.attrs.get('approximate', 'none')!r})"
        elif n.op == "cast":
            e = args[0]
        elif n.op in ("clamp", "hardtanh"):
            lo = args[1] if n.op == "clamp" else literal(n.attrs["lo"])
            hi = (args[2] if len(args) > 2 else "None") if n.op == "clamp" else literal(n.attrs["hi"])
            e = f"torch.clamp({args[0]}, {lo}, {hi})"
        elif n.op == "leaky_relu":
            e = f"torch.nn.functional.leaky_relu({args[0]}, {n.attrs['slope']!r})"
        elif n.op == "softplus":
            e = f"torch.nn.functional.softplus({args[0]}, {n.attrs['beta']!r}, {n.attrs['threshold']!r})"
        elif n.op == "elu":
            e = (f"torch.nn.functional.elu({args[0]} * {n.attrs['input_scale']!r}, {n.attrs['alpha']!r}) * "
                 f"{n.attrs['scale']!r}")
        elif n.op in _TORCH_PW:
            e = _TORCH_PW[n.op].format(*args)
        else:
            raise ValueError(f"no PyTorch rendering for pointwise op {n.op}")
        if n.dtype == "bool":
            return e
        return f"torch.as_tensor({e}).to(torch.{n.dtype})"
    raise ValueError(f"cannot render {n.kind} node {n.name} with PyTorch")


# -- GEMM groups ----------------------------------------------------------------------------------

def _opname(value: str) -> str:
    return f"op_{value}"


def _gemm_source(graph: Graph, grp: Group, settings: dict, variant: dict) -> tuple[str, str, dict, dict]:
    """(kernel + launcher text, the forward lines, config, space) for one GEMM group."""
    gnode = graph.node(grp.gemm)
    a, b = gnode.args[0].name, gnode.args[1].name
    dtype = graph.node(a).dtype
    members = set(grp.nodes)
    ln = grp.__dict__.get("ln_operands", {})
    operands: list[Operand] = []
    passed: list[str] = []
    for value, kind in grp.operand_kinds.items():
        operands.append(Operand(_opname(value), kind))
        passed.append(_pass_operand(graph, grp, value, kind))
    for value, label in ln.items():
        operands.append(Operand(label, "row"))
        passed.append(f"{value}.reshape(-1)")

    scalars: list[str] = []

    def chain(names: list[str], first: str) -> str:
        env = {first: "acc"}
        lines = []
        for name in names:
            node = graph.node(name)
            args, raw = [], []
            for x in node.args:
                raw.append(x)
                if isinstance(x, Dyn):  # a run-time number: a scalar operand of the template
                    if x.expr not in scalars:
                        scalars.append(x.expr)
                        operands.append(Operand(f"c{len(scalars) - 1}", "scalar"))
                        passed.append(x.expr)
                    args.append(f"c{scalars.index(x.expr)}")
                elif isinstance(x, Ref):
                    args.append(env[x.name] if x.name in env else _opname(x.name))
                elif x is None:
                    args.append("None")
                else:
                    args.append(literal(x))
            e = emit_pw(node.op, args, node.attrs, raw)
            if node.dtype in ("float16", "bfloat16"):  # round like the reference's separate ops
                e = round_to(e, node.dtype)
            lines.append(f"v_{name} = {e}")
            env[name] = f"v_{name}"
        if names:
            lines.append(f"acc = v_{names[-1]}")
        return "\n".join(lines)

    epilogue = chain(grp.epilogue, grp.gemm)
    if gnode.dtype in ("float16", "bfloat16") and (epilogue or grp.row_reduction):
        # the reference stores the product in the half type before the next op reads it
        epilogue = f"acc = {round_to('acc', gnode.dtype)}\n{epilogue}"
    row_first = grp.row_block[-1] if grp.row_block else None
    row_epi = chain(grp.row_epilogue, row_first) if grp.row_epilogue else ""
    prec = variant.get("fp32_precision") or default_precision(graph, grp, settings)
    if prec == "tf32rn":
        raise ValueError(f"{grp.id}: precision tf32rn is for conv groups (a GEMM's reference is cuBLAS fp32, not TF32)")
    spec = GemmSpec(
        name=grp.id, batched=gnode.op == "bmm", trans_b=gnode.op == "linear", dtype=dtype,
        allow_tf32=allow_tf32(dtype, settings["atol"], settings["rtol"]) and prec != "ieee",
        operands=tuple(operands), epilogue=epilogue, row_reduction=grp.row_reduction,
        row_epilogue=row_epi,
        split_k=int(variant.get("split_k", auto_split_k(graph, grp))) if not grp.row_reduction else 1,
        persistent=bool(variant.get("persistent", False)),
        fp32_precision=prec if dtype == "float32" and prec in ("ieee", "tf32", "tf32x3") else None,
    )
    ks = gemm_kernel(spec)
    config = dict(ks.config)
    if grp.row_reduction == "layernorm":
        config["eps"] = float(grp.__dict__.get("ln_eps", 1e-5))
    for key, val in (variant.get("config") or {}).items():
        config[key] = val
    tail = graph.node(grp.tail)
    if gnode.op == "bmm":
        a_expr, lead = a, None
    else:
        a_expr, lead = f"{a}.reshape(-1, {a}.shape[-1])", f"{a}.shape[:-1]"
    call = f"launch_{grp.id}({a_expr}, {b}{''.join(', ' + p for p in passed)}, config=CONFIG[{grp.id!r}])"
    lines = [f"{grp.tail} = {call}"]
    vector = ks.output == "vector"
    if lead is not None:
        if vector:
            lines.append(f"{grp.tail} = {grp.tail}.view({lead})")
        else:
            lines.append(f"{grp.tail} = {grp.tail}.view(*{lead}, {grp.tail}.shape[-1])")
    if vector and tail.shape is not None and len(tail.shape) == len(gnode.shape):
        lines.append(f"{grp.tail} = {grp.tail}.unsqueeze(-1)")
    if tail.dtype != dtype:
        lines.append(f"{grp.tail} = {grp.tail}.to(torch.{tail.dtype})")
    _ = members
    space = dict(ks.space)
    for key, val in (variant.get("config") or {}).items():
        # a value the planner set (GROUP_M=16) stays tunable: the tuner refuses a default outside its SPACE
        if isinstance(space.get(key), list) and val not in space[key]:
            space[key] = sorted([*space[key], val])
    return ks.source, "\n".join(lines), config, space


def conv_precision(graph: Graph, grp: Group, settings: dict) -> str:
    """The seed's dot precision of a conv group, by the GEMM rule (``default_precision``) with
    K = Cin/groups * taps; half types ignore it."""
    cnode = graph.node(grp.gemm)
    dtype = graph.node(cnode.args[0].name).dtype
    if dtype != "float32":
        return "ieee"
    if allow_tf32(dtype, settings["atol"], settings["rtol"]):
        return "tf32"
    w = graph.node(cnode.args[1].name).shape or (1, 1)
    k = conv_cin_g(graph, cnode) * math.prod(w[2:])
    return "tf32x3" if tf32x3_ok(dtype, settings["atol"], settings["rtol"], int(k), reads_weight(graph, cnode)) \
        else "ieee"


def conv_cin_g(graph: Graph, cnode: Any) -> int:
    """A conv node's input channels per group, as its weight fixes them ([Cout, Cin/g, ...]; transposed
    [Cin, Cout/g, ...]); a weight of unknown shape counts as one channel."""
    w = graph.node(cnode.args[1].name).shape or (1, 1)
    if cnode.attrs["transposed"]:
        return int(w[0]) // max(1, cnode.attrs["groups"] or 1)
    return int(w[1])


def _conv_source(graph: Graph, grp: Group, settings: dict, variant: dict) -> tuple[str, str, dict, dict]:
    """(kernel + launcher text, the forward lines, config, space) for one convolution group."""
    cnode = graph.node(grp.gemm)
    x, w = cnode.args[0].name, cnode.args[1].name
    dtype = graph.node(x).dtype
    operands: list[ConvOperand] = [ConvOperand(_opname(v), "tensor") for v in grp.operand_kinds]
    passed: list[str] = list(grp.operand_kinds)
    env = {cnode.name: "acc"}
    lines: list[str] = []
    if cnode.dtype in ("float16", "bfloat16") and grp.epilogue:
        lines.append(f"acc = {round_to('acc', cnode.dtype)}")  # stored in the half type by the reference
    scalars: list[str] = []
    for name in grp.epilogue:
        node = graph.node(name)
        args = []
        for a in node.args:
            if isinstance(a, Dyn):  # a run-time number: a scalar operand of the template
                if a.expr not in scalars:
                    scalars.append(a.expr)
                    operands.append(ConvOperand(f"c{len(scalars) - 1}", "scalar"))
                    passed.append(a.expr)
                args.append(f"c{scalars.index(a.expr)}")
            elif isinstance(a, Ref):
                args.append(env.get(a.name, _opname(a.name)))
            else:
                args.append("None" if a is None else literal(a))
        if node.kind == "reduce":  # over the channels, all in this tile: masked columns excluded
            fill = {"sum": "0.0", "mean": "0.0", "amax": 'float("-inf")', "amin": 'float("inf")'}[node.op]
            fn = {"sum": "sum", "mean": "sum", "amax": "max", "amin": "min"}[node.op]
            e = f"tl.{fn}(tl.where(mask_n[None, :], {args[0]}, {fill}), 1)[:, None]"
            if node.op == "mean":
                e = f"({e} / tl.sum(tl.where(mask_n, 1.0, 0.0), 0))"
        else:
            e = emit_pw(node.op, args, node.attrs, list(node.args))
        if node.dtype in ("float16", "bfloat16"):
            e = round_to(e, node.dtype)
        lines.append(f"v_{name} = {e}")
        env[name] = f"v_{name}"
    if grp.epilogue:
        lines.append(f"acc = v_{grp.epilogue[-1]}")
    a = cnode.attrs
    prec = variant.get("fp32_precision") or conv_precision(graph, grp, settings)
    # a Precision action pins the conv's numerics everywhere; the seed's follows the reference's at call time
    # (unless the tolerances admit plain TF32 already: then our own TF32 conv passes against either)
    follow = CONV_ON_TF32_REFERENCE if dtype == "float32" and not variant.get("fp32_precision") \
        and prec != "tf32" else None
    tail_node = graph.node(grp.tail)
    if grp.row_reduction:
        reduction, keepdim = grp.row_reduction, bool(tail_node.attrs["keepdim"])
        axis = "channel" if tuple(tail_node.attrs["dims"]) == (1,) else "spatial"
    elif tail_node.shape != cnode.shape:  # one value per pixel, made by channel reductions in the epilogue
        reduction, keepdim, axis = "first", True, "channel"
    else:
        reduction, keepdim, axis = None, False, "spatial"
    spec = ConvSpec(name=grp.id, dims=a["dims"], stride=tuple(a["stride"]), padding=tuple(a["padding"]),
                    dilation=tuple(a["dilation"]), output_padding=tuple(a["output_padding"]), groups=a["groups"],
                    transposed=a["transposed"], dtype=dtype, fp32_precision=prec, operands=tuple(operands),
                    epilogue="\n".join(lines), reduction=reduction, keepdim=keepdim, red_axis=axis,
                    whole_channels=any(graph.node(n).kind == "reduce" for n in grp.epilogue), tf32_reference=follow,
                    channels_in=conv_cin_g(graph, cnode))
    ks = conv_kernel(spec)
    config = {**ks.config, **(variant.get("config") or {})}
    space = dict(ks.space)
    for key, val in (variant.get("config") or {}).items():
        if isinstance(space.get(key), list) and val not in space[key]:
            space[key] = sorted([*space[key], val])
    tail = graph.node(grp.tail)
    call = [f"{grp.tail} = launch_{grp.id}({x}, {w}{''.join(', ' + p for p in passed)}, config=CONFIG[{grp.id!r}])"]
    if tail.dtype != dtype:
        call.append(f"{grp.tail} = {grp.tail}.to(torch.{tail.dtype})")
    return ks.source, "\n".join(call), config, space


SMS = 132  # H200 streaming multiprocessors


SPLIT_MIN_R = 1 << 16  # rows at least this long, and fewer of them than SMs, are reduced in chunks


def few_long_rows(grp: Group) -> bool:
    """A rows group of fewer rows than SMs, each at least ``SPLIT_MIN_R`` long: one program a row leaves SMs idle
    (the premise of the seed's split reduction, ``auto_split_r``, and of ``partition``'s cuts of a norm)."""
    if grp.kind != "rows" or not grp.domain:
        return False
    r = math.prod(grp.domain[d] for d in grp.red_dims)
    return r >= SPLIT_MIN_R and math.prod(grp.domain) // max(1, r) < SMS


def auto_split_r(graph: Graph, grp: Group) -> int:
    """The seed's split reduction for a rows group of fewer rows than SMs, each at least ``SPLIT_MIN_R`` long:
    one program a row left the GPU idle (100_HingeLoss's mean over 2^30 elements: 442 ms, torch.compile's
    0.95 ms), so each row runs as chunks of its own, about four programs per SM, each chunk >= 256 long
    (``SPLIT_R``, which the tuner may set back to 1). 1 otherwise, and where the group cannot split (a
    reduction with an epilogue that needs the whole row, as a norm's). Up to 1024 chunks: one row cut in 256
    ran as 128 programs (the launcher packs two chunks of a long row in a program), under one per SM."""
    if not few_long_rows(grp) or not split_reduction_ok(graph, grp):
        return 1
    r = math.prod(grp.domain[d] for d in grp.red_dims)
    rows = math.prod(grp.domain) // max(1, r)
    parts = 1
    while rows * parts < 4 * SMS and r // (parts * 2) >= SPLIT_MIN_CHUNK and parts < 1024:
        parts *= 2
    return parts


def auto_split_k(graph: Graph, grp: Group) -> int:
    """The seed's split-K for a GEMM with too few output tiles to fill the GPU and a long K (the rule is
    clear there: the 128x128 grid leaves SMs idle while each tile walks all of K). The smallest power of
    two that gives at least one tile per SM, keeping >= 2048 of K per split; 1 otherwise."""
    gnode = graph.node(grp.gemm)
    a = graph.node(gnode.args[0].name)
    if grp.row_reduction or gnode.shape is None or a.shape is None or len(gnode.shape) < 2:
        return 1
    k = int(a.shape[-1])
    m, n = int(gnode.shape[-2]), int(gnode.shape[-1])
    batch = int(gnode.shape[0]) if gnode.op == "bmm" else 1
    if gnode.op != "bmm":
        m = 1
        for d in gnode.shape[:-1]:
            m *= int(d)
    tiles = -(-m // 128) * -(-n // 128) * batch
    split = 1
    while tiles * split < SMS and k // (split * 2) >= 2048 and split < 16:
        split *= 2
    return split


def _pass_operand(graph: Graph, grp: Group, value: str, kind: str) -> str:
    batched = graph.node(grp.gemm).op == "bmm"
    if kind == "matrix":
        return value if batched else f"{value}.reshape(-1, {value}.shape[-1])"
    if kind == "col" and batched:
        return value
    return f"{value}.reshape(-1)"


# -- the file -------------------------------------------------------------------------------------

def _split_future(source: str) -> tuple[str, str]:
    fut, rest = [], []
    for line in source.splitlines():
        (fut if re.match(r"\s*from __future__ import", line) else rest).append(line)
    return "\n".join(fut), "\n".join(rest)


def _param_expr(fqn: str) -> str:
    *mods, leaf = fqn.split(".")
    base = "self"
    for m in mods:
        base = f"{base}.{m}" if m.isidentifier() else f"getattr({base}, {m!r})"
    return f"{base}.{leaf}" if leaf.isidentifier() else f"getattr({base}, {leaf!r})"


def generate(problem_name: str, problem_source: str, graph: Graph, groups: list[Group], settings: dict,
             variants: dict[str, dict], actions: list[str]) -> tuple[str, dict]:
    """The candidate source and a meta dict (kernel groups, uncaptured ops, notes)."""
    kernels: list[str] = []
    config: dict[str, dict] = {}
    space: dict[str, dict] = {}
    body: list[str] = []
    n_kernels = 0
    for grp in groups:
        variant = variants.get(grp.id, {})
        if grp.kind == "torch":
            for name in grp.nodes:
                body.append(f"{name} = {_torch_node(graph.node(name))}")
            continue
        if grp.kind == "gemm":
            src, call, cfg, spc = _gemm_source(graph, grp, settings, variant)
        elif grp.kind == "conv":
            src, call, cfg, spc = _conv_source(graph, grp, settings, variant)
        elif grp.kind == "special":
            ss = special_kernel(graph, grp, variant.get("config") or {})
            src, call, cfg, spc = ss.source, ss.call, ss.config, ss.space
        else:
            opts = {**(variant.get("config") or {}), "mode": variant.get("mode", "auto"),
                    "persistent": bool(variant.get("persistent", False)), "split_r": int(variant.get("split_r", auto_split_r(graph, grp)))}
            ls = loop_kernel(graph, grp, opts)
            src, cfg, spc = ls.source, ls.config, ls.space
            outs = ", ".join(ls.outputs)
            call = f"{outs} = launch_{grp.id}({', '.join(ls.inputs + ls.scalars)})"
        n_kernels += 1
        kernels.append(f"# {grp.describe(graph)}\n{src}")
        config[grp.id], space[grp.id] = cfg, spc
        body.extend(call.splitlines())

    fut, psrc = _split_future(problem_source)
    used_params = {n.name: n.op for n in graph.nodes if n.kind == "param"}
    fwd = [f"        {name} = {_param_expr(fqn)}" for name, fqn in used_params.items()]
    first = graph.inputs[0] if graph.inputs else None
    if first:
        fwd.append(f"        _dev = {first}.device if isinstance({first}, torch.Tensor) else None")
    fwd += [f"        {ln}" for ln in body]
    outs = [_render(o) for o in graph.outputs]
    fwd += [f"        {_param_expr(fqn)}.copy_({outs[i]})" for i, fqn in sorted(graph.mutations.items())]
    outs = [o for i, o in enumerate(outs) if i not in graph.mutations]
    ret = outs[0] if graph.single_output and len(outs) == 1 else "(" + ", ".join(outs) + ("," if len(outs) == 1 else "") + ")"
    fwd.append(f"        return {ret}")
    group_lines = "\n".join(f"  {g.describe(graph)}" for g in groups if g.kind != "torch")
    left = ", ".join(graph.uncaptured) or "nothing"
    doc = (f'"""kernellab builtin candidate for {problem_name}: {n_kernels} generated Triton kernel(s).\n\n'
           f"Actions from the seed: {', '.join(actions) or '(seed)'}\n"
           f"Kernel groups:\n{group_lines or '  (none)'}\n"
           f"Left to PyTorch: {left}\n"
           "Numerics: pointwise and reduction math in fp32; GEMMs accumulate in fp32, fp32 GEMMs use IEEE\n"
           f"dot products unless atol and rtol are both >= {TF32_MIN_TOL} (then TF32) or the tolerances\n"
           "admit 3xTF32 (tf32x3_ok: K and whether a weight is read). A seed's fp32 conv on CUDA follows the\n"
           f"reference's cuDNN TF32 conv when the flags make it TF32 at call time ({CONV_ON_TF32_REFERENCE}).\n"
           '"""\n')
    parts = [doc]
    if fut:
        parts.append(fut + "\n")
    parts.append("# ---- the problem (Model and its constants), copied verbatim ----\n" + psrc.strip("\n") + "\n")
    parts.append("# ---- generated by kernellab.agents.builtin ----\nimport math  # noqa: E402\n"
                 "import torch  # noqa: E402\nimport triton  # noqa: E402\nimport triton.language as tl  # noqa: E402\n")
    parts.append(f"CONFIG = {_pretty(config)}\n\nSPACE = {_pretty(space)}\n")
    parts.append(HELPERS.strip("\n") + "\n\n" + RUNTIME_HELPERS.strip("\n") + "\n")
    parts += [k.rstrip("\n") + "\n" for k in kernels]
    args = ", ".join(graph.inputs)
    parts.append("class ModelNew(Model):\n"
                 '    """Model with its forward replaced by the generated kernels (same parameters)."""\n\n'
                 f"    def forward(self, {args}):\n" + "\n".join(fwd) + "\n")
    source = "\n\n".join(parts)
    meta = {"kernels": n_kernels, "groups": [g.describe(graph) for g in groups],
            "uncaptured": list(graph.uncaptured), "capture": graph.method, "notes": list(graph.notes)}
    return source, meta


def _pretty(d: dict) -> str:
    if not d:
        return "{}"
    lines = ["{"]
    for k, v in d.items():
        lines.append(f"    {k!r}: {v!r},")
    lines.append("}")
    return "\n".join(lines)

