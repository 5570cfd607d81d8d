"""Convolution Triton template: ``conv_kernel(spec) -> KernelSource`` (kernel text + launcher text).

One implicit-GEMM template covers conv1d/2d/3d, strided, padded, dilated, grouped and depthwise, and
the transposed convolution, with a fused pointwise epilogue (bias, activation, scaling, residual...).

Layout (why the kernel looks the way it does):
- Every convolution is run as a 3-D one: the launcher views 1-D and 2-D tensors as 5-D with size-1
  dims (stride 1, padding 0 there), so one kernel text serves all ranks.
- GEMM view per group ``g``: M = N*OD*OH*OW output pixels, N = Cout/groups channels, K = Cin/groups *
  KD*KH*KW taps. The A tile [BLOCK_M, BLOCK_K] is gathered from the input (masked where a tap falls in
  the padding), never materialised (no im2col buffer); the B tile is read straight from the weight, whose
  flat index over (ci, kd, kh, kw) is the GEMM's k for an ordinary conv ([Cout, Cin/g, KD, KH, KW]).
- Transposed conv (``out[o] += x[i] * w[ci, co, k]`` for ``o = i*s - p + k*d``) gathers the other way:
  for output ``o`` and tap ``k`` the input is ``i = (o + p - k*d) / s`` where that divides exactly.
  Stride > 1 then wastes (s-1)/s of the taps per dim on masked loads: correct, not yet fast.
- K order. Flat (k = the weight's own (ci, kd, kh, kw) index): every element of the A tile computes its tap's
  input pixel and bounds, some 20 integer ops, and on the H200 our TF32 convs ran 2-7x slower than cuDNN
  (KernelBench 17: 6.5 ms tuned, the whole problem 4.4 ms in eager). Tap-major (``TAP_MAJOR``, where a channel
  group has 16 or more input channels and the kernel runs dots): one K step per (tap, block of BLOCK_K input
  channels), so a tap's input pixel and bounds are vectors of BLOCK_M, and the gather one add per element.
  Fewer input channels keep the flat order, whose K blocks taps fill (Cin 3 x 27 taps: 81 of 96 used). A
  sub-pixel phase steps through its own taps only, in either order. ``NHWC`` (tap-major only) copies the input
  and the weight channels-innermost first, so that a K block is a run of channels at stride 1.
- Tiles are ordered in groups of ``GROUP_M`` pixel blocks (the weight tile is reused from L2).
- Channel groups narrower than ``DOT_MIN_N`` (8; depthwise: one channel per group) take the FMA path (an
  outer product summed over BLOCK_K in registers, exact fp32); wider ones a dot of at least 16 columns.

Numerics: fp32 accumulation always; float32 dots use ``input_precision`` ``ieee`` or ``tf32x3`` (~fp32
accuracy on the tensor cores; codegen decides by the problem's tolerances) or ``tf32`` at loose ones, or
``tf32rn``: both operands rounded to TF32 with round-to-nearest, ties away (PTX ``cvt.rna.tf32.f32``,
what cuDNN/CUTLASS do; that instruction on the GPU, the same rounding by bit arithmetic in the interpreter)
before a ``tf32`` dot, whose tensor cores would otherwise truncate the low 13
mantissa bits; every product is then exactly cuDNN's TF32 product and only the summation order differs.
The FMA path (depthwise) stays exact fp32 at every precision.
The epilogue runs on the fp32 accumulator, and the result is rounded once to the output dtype.

The TF32 reference (``ConvSpec.tf32_reference``): on CUDA, PyTorch runs an fp32 conv through cuDNN in
TF32 by default (``torch.backends.cudnn.conv.fp32_precision == "tf32"``), so the reference a candidate
is judged against is TF32-rounded. With ``tf32_reference`` set, the launcher reads those flags at call
time, as the reference's conv sees them, and on a fp32 CUDA tensor under a TF32 cuDNN conv it either
runs ``tf32rn`` dots ("tf32rn") or calls cuDNN itself with exactly the reference's arguments and
layout (so cuDNN picks the same algorithm) and runs this kernel with ``LIBRARY``: the K loop replaced
by a load of cuDNN's output, the epilogue and reductions as fused as ever ("cudnn"). Anywhere else
(the CPU, half types, TF32 off, cuDNN off) the kernel is the spec's own conv.
"""

from __future__ import annotations

import ast
import keyword
import textwrap
from dataclasses import dataclass
from typing import Any

from . import conv_template as T
from .gemm import KernelSource
from .template import indent, render, stmts

__all__ = ["ConvSpec", "ConvOperand", "conv_kernel", "CONV_OPERAND_KINDS", "DOT_MIN_N", "REDUCTIONS",
           "TAP_MAJOR_MIN_CIN", "TF32_REFERENCE_MODES"]

CONV_OPERAND_KINDS = ("tensor", "scalar")
_DTYPES = ("float32", "float16", "bfloat16")
_PRECISIONS = ("ieee", "tf32", "tf32x3", "tf32rn")
TF32_REFERENCE_MODES = (None, "cudnn", "tf32rn")
_RESERVED = {"acc", "mask_n", "tl", "triton", "torch", "math"}
# "first" (channel axis only): the epilogue already made one value per pixel (a logsumexp over the
# channels...), broadcast along the row; the store keeps column 0
REDUCTIONS = (None, "sum", "mean", "amax", "amin", "first")
# channel groups narrower than this (the default config's) take the FMA path, exact fp32 at any dot precision
DOT_MIN_N = 8
# input channels per group from which the K loop runs tap-major (a K block of 16 filled by channels alone)
TAP_MAJOR_MIN_CIN = 16


@dataclass(frozen=True)
class ConvOperand:
    """An extra input of the epilogue: ``tensor`` (anything that broadcasts to the output, e.g. a
    [C, 1, 1] bias or a full-size residual) or ``scalar`` (a Python number)."""

    name: str
    kind: str


@dataclass(frozen=True)
class ConvSpec:
    """What to generate. ``dims``: spatial rank (1, 2, 3). stride/padding/dilation/output_padding:
    one int per spatial dim. ``groups`` 0 (ordinary conv only): Cin / weight.shape[1], read at run time.
    ``epilogue``: Triton statements reading ``acc`` (fp32 [BLOCK_M, BLOCK_N]) and the operands by name,
    assigning ``acc``."""

    name: str
    dims: int = 2
    stride: tuple[int, ...] = (1, 1)
    padding: tuple[int, ...] = (0, 0)
    dilation: tuple[int, ...] = (1, 1)
    output_padding: tuple[int, ...] = (0, 0)
    groups: int = 1
    transposed: bool = False
    dtype: str = "float32"
    fp32_precision: str = "ieee"
    operands: tuple[ConvOperand, ...] = ()
    epilogue: str = ""
    # a reduction over all spatial dims that follows the epilogue (global average pool...): the
    # launcher then returns [N, C] (``keepdim``: [N, C, 1, ...]) and the full output is never stored
    reduction: str | None = None
    keepdim: bool = False
    # "spatial" (above) or "channel": over dim 1 with every channel in one tile (groups == 1), the
    # launcher then returns [N, *spatial] (``keepdim``: [N, 1, *spatial])
    red_axis: str = "spatial"
    # the epilogue reduces over the channels itself (softmax over dim 1...): every channel in one tile;
    # the epilogue sees ``mask_n`` (the real channels) to leave the padding columns out
    whole_channels: bool = False
    # what to run when the call's reference conv is cuDNN in TF32 (see the module docstring): None (the
    # spec's own conv always), "cudnn" (cuDNN's conv + this kernel as its fused epilogue), "tf32rn"
    tf32_reference: str | None = None
    # input channels per group where the weight fixes them (0: unknown): fewer than 16 never run tap-major,
    # so their space has no TAP_MAJOR to tune
    channels_in: int = 0


def _check(spec: ConvSpec) -> None:
    where = f"ConvSpec {spec.name!r}"
    if not spec.name.isidentifier() or keyword.iskeyword(spec.name):
        raise ValueError(f"{where}: name must be a Python identifier")
    if spec.dims not in (1, 2, 3):
        raise ValueError(f"{where}: dims must be 1, 2 or 3, got {spec.dims}")
    for label in ("stride", "padding", "dilation", "output_padding"):
        v = getattr(spec, label)
        if len(v) != spec.dims or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ValueError(f"{where}: {label} must be {spec.dims} ints, got {v!r}")
    if min(spec.stride) < 1 or min(spec.dilation) < 1 or min(spec.padding) < 0 or min(spec.output_padding) < 0:
        raise ValueError(f"{where}: stride and dilation must be >= 1, padding and output_padding >= 0")
    if not isinstance(spec.groups, int) or spec.groups < (1 if spec.transposed else 0):
        raise ValueError(f"{where}: groups must be an int >= 1 (0: Cin / weight.shape[1], not transposed)")
    if spec.dtype not in _DTYPES:
        raise ValueError(f"{where}: dtype {spec.dtype!r} not in {_DTYPES}")
    if spec.fp32_precision not in _PRECISIONS:
        raise ValueError(f"{where}: fp32_precision {spec.fp32_precision!r} not in {_PRECISIONS}")
    if not isinstance(spec.channels_in, int) or spec.channels_in < 0:
        raise ValueError(f"{where}: channels_in must be an int >= 0, got {spec.channels_in!r}")
    if spec.tf32_reference not in TF32_REFERENCE_MODES:
        raise ValueError(f"{where}: tf32_reference {spec.tf32_reference!r} not in {TF32_REFERENCE_MODES}")
    seen = set()
    for op in spec.operands:
        if op.kind not in CONV_OPERAND_KINDS:
            raise ValueError(f"{where}: operand {op.name!r} kind {op.kind!r} not in {CONV_OPERAND_KINDS}")
        if not op.name.isidentifier() or keyword.iskeyword(op.name) or op.name in _RESERVED or op.name in seen:
            raise ValueError(f"{where}: operand name {op.name!r} is not a free identifier")
        seen.add(op.name)
    if spec.reduction not in REDUCTIONS:
        raise ValueError(f"{where}: reduction {spec.reduction!r} not in {REDUCTIONS}")
    if spec.reduction == "first" and spec.red_axis != "channel":
        raise ValueError(f"{where}: reduction 'first' is for the channel axis")
    if spec.red_axis not in ("spatial", "channel"):
        raise ValueError(f"{where}: red_axis {spec.red_axis!r} is not 'spatial' or 'channel'")
    if (spec.reduction and spec.red_axis == "channel" or spec.whole_channels) and spec.groups != 1:
        raise ValueError(f"{where}: a channel reduction needs groups == 1")
    try:
        ast.parse(textwrap.dedent(spec.epilogue))
    except SyntaxError as e:
        raise ValueError(f"{where}: epilogue is not valid Python: {e}") from None


def default_config(spec: ConvSpec) -> dict[str, Any]:
    # the seed's: where it is tuned, cuDNN runs the conv and these are its epilogue's tiles. 128 pixels x 64
    # channels x 32 taps: Cout of the KernelBench convs is 16-128, and K = Cin*taps is often < 100
    config = {"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 4, "num_stages": 3,
              "DOT_MIN_N": DOT_MIN_N, "TAP_MAJOR": 1, "NHWC": 0}
    if spec.tf32_reference != "cudnn":
        # our own conv's (the precision children): of the 27 tunings of tf32rn/tf32x3 children in the KernelBench run
        # (kb-public-level12-budget4.db.gz, the H200, the flat K loop), 64 pixels x 128 channels x 16, two warps, was
        # the best in 23, 1.0-2.9x faster than the seed's tiles (17: 16.6 -> 6.5 ms); as a default it also keeps more
        # children inside the tuning gap (graph.TUNE_GAP)
        config.update(BLOCK_M=64, BLOCK_N=128, BLOCK_K=16, num_warps=2)
        # channels innermost where the K loop is tap-major: on the H200 KernelBench 17's tf32rn child took 4.30 ms
        # with it against 6.16 without (2026-12-05-nvidia-h200-conv-kloop-17.md)
        config["NHWC"] = 1
    return config


def space(spec: ConvSpec) -> dict[str, list]:
    out = {"BLOCK_M": [32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128], "BLOCK_K": [16, 32, 64],
           "GROUP_M": [1, 8], "num_warps": [2, 4, 8], "num_stages": [2, 3, 4], "DOT_MIN_N": [1, 4, 8, 16],
           "TAP_MAJOR": [0, 1], "NHWC": [0, 1]}
    if spec.tf32_reference == "cudnn" and spec.dtype == "float32":
        # where it is tuned (a GPU, the reference's default flags) cuDNN runs the conv and the kernel only its
        # epilogue (LIBRARY): no K loop, so BLOCK_K and num_stages change nothing there and would only multiply
        # the space by 36. CONFIG keeps them for the kernel's own conv (the CPU, TF32 off).
        del out["BLOCK_K"], out["num_stages"], out["TAP_MAJOR"], out["NHWC"]
    elif 0 < spec.channels_in < TAP_MAJOR_MIN_CIN:  # the flat K order always (the launcher's rule)
        del out["TAP_MAJOR"], out["NHWC"]
    return out


def _kernel_src(spec: ConvSpec) -> str:
    name = spec.name
    kname, epi_fn = f"{name}_kernel", f"_{name}_epilogue"
    has_epi = bool(stmts(spec.epilogue))
    helpers: list[str] = []
    if has_epi:
        helpers = ["@triton.jit", f"def {epi_fn}({', '.join(['acc', 'mask_n', *[o.name for o in spec.operands]])}):",
                   *indent(stmts(spec.epilogue), 1), "    return acc", ""]
    red = spec.reduction if spec.red_axis == "spatial" else None
    cred = spec.reduction if spec.red_axis == "channel" else None
    params = ["x_ptr", "w_ptr", "out_ptr"]
    strides: list[str] = []
    for op in spec.operands:
        if op.kind == "scalar":
            params.append(f"v_{op.name}")
        else:
            params.append(f"p_{op.name}")
            strides += [f"s_{op.name}_{i}" for i in range(5)]
    params += ["NB", "ID", "IH", "IW", "COUT", "OD", "OH", "OW",
               "sxn", "sxc", "sxd", "sxh", "sxw", "sw0", "sw1", "swd", "swh", "sww", *strides]
    consts = ["CIN_G", "COUT_G", "KD", "KH", "KW", "SD", "SH", "SW", "PD", "PH", "PW", "DD", "DH", "DW",
              "TRANSPOSED", "SUBPIX", "USE_DOT", "UPCAST", "BIG", "TF32RN", "RNA_ASM", "LIBRARY", "TAP_MAJOR", "BLOCK_M",
              "BLOCK_N", "BLOCK_K", "GROUP_M"]
    if red:
        params.insert(3, "ws_ptr")
    params += [f"{c}: tl.constexpr" for c in consts]
    prec = spec.fp32_precision if spec.dtype == "float32" else "ieee"
    rna = f"_{name}_tf32_rna"
    if spec.dtype == "float32":
        # TF32RN (a constexpr: the spec's "tf32rn", or a TF32 reference seen at call time) rounds both
        # operands the way cuDNN does before the tensor cores see them
        dot = ["if TF32RN:", f'    acc = tl.dot({rna}(a, RNA_ASM), {rna}(b, RNA_ASM), acc, input_precision="tf32")', "else:",
               f'    acc = tl.dot(a, b, acc, input_precision="{"tf32" if prec == "tf32rn" else prec}")']
        helpers += render(T.TF32_RNA, NAME=rna)
    else:
        dot = ["acc = tl.dot(a, b, acc)"]

    tap_input = f"_{name}_tap_input"  # named in the kernel's transposed branches, which a constexpr leaves out otherwise
    helpers += render(T.TAP_INPUT, NAME=tap_input)
    subpix = _subpixel(spec)
    loads, epi_args = [], []
    for op in spec.operands:
        n = op.name
        if op.kind == "scalar":
            epi_args.append(f"v_{n}")
            continue
        loads += [
            f"m_{n} = nb * s_{n}_0 + od * s_{n}_2 + oh * s_{n}_3 + ow * s_{n}_4",
            f"o_{n} = tl.load(p_{n} + m_{n}[:, None] + co[None, :] * s_{n}_1, "
            "mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)",
        ]
        epi_args.append(f"o_{n}")
    epilogue = [f"acc = {epi_fn}({', '.join(['acc', 'mask_n', *epi_args])})"] if has_epi else []
    if red:
        if red in ("sum", "mean"):
            part = "tl.sum(tl.where(mask_m[:, None], acc, 0.0), 0)"
        else:
            fill = 'float("-inf")' if red == "amax" else 'float("inf")'
            part = f"tl.{'max' if red == 'amax' else 'min'}(tl.where(mask_m[:, None], acc, {fill}), 0)"
        store = render(T.STORE_POOLED, PART=part)
    elif cred:
        if cred == "first":
            row = "tl.sum(tl.where((tl.arange(0, BLOCK_N) == 0)[None, :], tl.broadcast_to(acc, (BLOCK_M, BLOCK_N)), 0.0), 1)"
        elif cred in ("sum", "mean"):
            row = "tl.sum(tl.where(mask_n[None, :], acc, 0.0), 1)" + (" / COUT" if cred == "mean" else "")
        else:
            fill = 'float("-inf")' if cred == "amax" else 'float("inf")'
            row = f"tl.{'max' if cred == 'amax' else 'min'}(tl.where(mask_n[None, :], acc, {fill}), 1)"
        store = render(T.STORE_CHANNEL_REDUCED, ROW=row)
    else:
        store = render(T.STORE_OUTPUT)
    lines = render(
        T.KERNEL, HELPERS=helpers, KERNEL=kname, PARAMS=[p + "," for p in params],
        GEMM_ROWS=T.SUBPIXEL_PHASE if subpix else ["M = NB * OD * OH * OW"],
        PIXEL_BLOCKS=["# reduced over the pixels of one sample: a pixel block never spans two samples",
                      "TPS = tl.cdiv(S, BLOCK_M)", "num_pid_m = NB * TPS"] if red else ["num_pid_m = tl.cdiv(M, BLOCK_M)"],
        # (sub-pixel: the grid covers the largest phase, so a program may lie past its own phase's tiles:
        # its rows are all masked, and group_rows must stay >= 1)
        GROUP_ROWS=["group_rows = tl.maximum(tl.minimum(num_pid_m - first_m, GROUP_M), 1)"] if subpix else
        ["group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)"],
        OFFS_M=["sp_t = pid_m % TPS", "sp_m = sp_t * BLOCK_M + tl.arange(0, BLOCK_M)",
                "offs_m = (pid_m // TPS) * S + sp_m", "mask_m = sp_m < S"] if red else
        ["offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)", "mask_m = offs_m < M"],
        MASK_PHASE=["# a program past its phase's tiles aliases a real tile with pid_n out of range: it must store",
                    "# nothing (a per-pixel store of a channel reduction would otherwise see only masked channels)",
                    "mask_m = mask_m & (pid < num_pid_m * num_pid_n)"] if subpix else [],
        PIXEL_COORDS=T.SUBPIXEL_PIXELS if subpix else T.PIXELS,
        TAP_COUNT=["kd0 = (rd + PD) % SD", "kh0 = (rh + PH) % SH", "kw0 = (rw + PW) % SW",
                   "TD = tl.maximum(tl.cdiv(KD - kd0, SD), 0)", "TH = tl.maximum(tl.cdiv(KH - kh0, SH), 0)",
                   "TW = tl.maximum(tl.cdiv(KW - kw0, SW), 0)", "KTOT = CIN_G * TD * TH * TW"] if subpix else
        ["KTOT = CIN_G * KD * KH * KW"],
        TAP_COORDS=T.SUBPIXEL_TAPS if subpix else T.TAPS,
        DOT=dot, LOAD_OPERANDS=loads, EPILOGUE=epilogue, STORE=store, TAP_INPUT=tap_input)
    text = "\n".join(lines) + "\n"
    if red:
        text += "\n\n" + _finish_src(spec)
    return text


def _subpixel(spec: ConvSpec) -> bool:
    """Transposed, strided, undilated, no pooling: the phase-split kernel (see ``_kernel_src``)."""
    return spec.transposed and max(spec.stride) > 1 and max(spec.dilation) == 1 and (
        spec.reduction is None or spec.red_axis == "channel")


def _finish_src(spec: ConvSpec) -> str:
    """The second kernel of a reduced conv: ws [N, TPS, C] -> out [N, C]."""
    red = spec.reduction
    if red in ("sum", "mean"):
        init, other, comb, fold = "0.0", "0.0", "r = r + v", "tl.sum(r, 0)"
    else:
        init = other = 'float("-inf")' if red == "amax" else 'float("inf")'
        op = "maximum" if red == "amax" else "minimum"
        comb, fold = f"r = tl.{op}(r, v)", f"tl.{'max' if red == 'amax' else 'min'}(r, 0)"
    return "\n".join(render(T.FINISH, NAME=spec.name, INIT=init, OTHER=other, COMBINE=[comb], FOLD=fold,
                            SCALE=["r = r / S"] if red == "mean" else [])) + "\n"


TF32_FLAGS_SRC = '''def _tf32_conv_reference(x):
    """Does PyTorch run a conv of ``x`` through cuDNN in TF32 right now (the reference's numerics): an fp32
    CUDA tensor under the TF32 flags (PyTorch's default)?"""
    b = torch.backends
    if not (x.is_cuda and x.dtype == torch.float32) or not b.cudnn.enabled or not b.cudnn.is_available():
        return False
    conv = getattr(b.cudnn, "conv", None)
    if conv is None:  # a torch without the fp32_precision API: the legacy flag
        return bool(b.cudnn.allow_tf32)
    # "none" inherits: cuDNN conv -> cuDNN -> the generic default (reading allow_tf32 instead raises when
    # the legacy and the new API were mixed)
    for p in (conv.fp32_precision, b.cudnn.fp32_precision, getattr(b, "fp32_precision", "none")):
        if p != "none":
            return p == "tf32"
    return False
'''


def _launcher_src(spec: ConvSpec, config: dict[str, Any]) -> str:
    name, nd = spec.name, spec.dims
    pad3 = 3 - nd
    stride = (1,) * pad3 + tuple(spec.stride)
    padding = (0,) * pad3 + tuple(spec.padding)
    dilation = (1,) * pad3 + tuple(spec.dilation)
    opad = (0,) * pad3 + tuple(spec.output_padding)
    tdt = f"torch.{spec.dtype}"
    kind = "conv_transpose" if spec.transposed else "conv"
    L = [
        f"def launch_{name}(x, w, *extra, config=None):",
        f'    """{name}: {kind}{nd}d(stride={spec.stride}, padding={spec.padding}, dilation={spec.dilation}, '
        f'groups={spec.groups}{", output_padding=" + str(spec.output_padding) if spec.transposed else ""})'
        f'{" + epilogue" if stmts(spec.epilogue) else ""}."""',
        f"    cfg = {{**{config!r}, **(config or {{}})}}",
        f"    if len(extra) != {len(spec.operands)}:",
        f'        raise TypeError(f"launch_{name}: expected {len(spec.operands)} extra operand(s), got {{len(extra)}}")',
        f"    if x.dim() != {nd + 2} or w.dim() != {nd + 2}:",
        f'        raise ValueError(f"launch_{name}: input and weight must be {nd + 2}-D, got {{tuple(x.shape)}} and {{tuple(w.shape)}}")',
        "    if x.dtype != w.dtype:",
        f'        raise TypeError(f"launch_{name}: input {{x.dtype}} and weight {{w.dtype}} differ")',
    ]
    fp32 = spec.dtype == "float32"
    follow = spec.tf32_reference if fp32 else None
    # read at call time, as the reference's conv reads them (a candidate never sets these flags)
    ref_tf32 = "_tf32_conv_reference(x)"
    L.append(f"    rn = {ref_tf32}" if follow == "tf32rn" else f"    rn = {fp32 and spec.fp32_precision == 'tf32rn'}")
    L.append(f"    lib = {ref_tf32}" if follow == "cudnn" else "    lib = False")
    L += [
        f"    x5 = x.reshape(x.shape[:2] + (1,) * {pad3} + x.shape[2:])",
        f"    w5 = w.reshape(w.shape[:2] + (1,) * {pad3} + w.shape[2:])",
        "    nb, cin, i_d, i_h, i_w = x5.shape",
        "    k_d, k_h, k_w = w5.shape[2:]",
        f"    groups = {spec.groups}" if spec.groups else "    groups = max(1, cin // w5.shape[1])",
    ]
    if spec.transposed:
        L += [
            "    cin_g, cout_g = cin // groups, w5.shape[1]",
            "    if w5.shape[0] != cin:",
            f'        raise ValueError(f"launch_{name}: weight {{tuple(w.shape)}} does not match {{cin}} input channels")',
            f"    o_d, o_h, o_w = ((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op in "
            f"zip((i_d, i_h, i_w), {stride}, {padding}, {dilation}, (k_d, k_h, k_w), {opad}))",
        ]
    else:
        L += [
            "    cin_g, cout_g = w5.shape[1], w5.shape[0] // groups",
            "    if cin_g * groups != cin or cout_g * groups != w5.shape[0]:",
            f'        raise ValueError(f"launch_{name}: weight {{tuple(w.shape)}} does not match {{cin}} input channels '
            f'in {{groups}} group(s)")',
            f"    o_d, o_h, o_w = ((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k in "
            f"zip((i_d, i_h, i_w), {stride}, {padding}, {dilation}, (k_d, k_h, k_w)))",
        ]
    L += [
        "    cout = cout_g * groups",
        "    oshape = (nb, cout) + (o_d, o_h, o_w)",
        f"    full = (nb, cout) + (o_d, o_h, o_w)[{pad3}:]  # the conv's own output shape",
    ]
    if follow == "cudnn":
        if spec.transposed:
            conv = (f"torch.nn.functional.conv_transpose{nd}d(x, w, None, {spec.stride}, {spec.padding}, "
                    f"{spec.output_padding}, groups, {spec.dilation})")
        else:
            conv = f"torch.nn.functional.conv{nd}d(x, w, None, {spec.stride}, {spec.padding}, {spec.dilation}, groups)"
        L += [
            "    if lib:",
            "        # the reference's own cuDNN call (same arguments, same layout: the same TF32 algorithm); the",
            "        # kernel below then runs the epilogue on its output",
            f"        y = {conv}",
        ]
        if not stmts(spec.epilogue) and not spec.reduction:
            L.append("        return y  # nothing to fuse")
        L.append("        y5 = y.reshape(oshape)")
    sred = spec.reduction if spec.red_axis == "spatial" else None
    whole = spec.whole_channels or bool(spec.reduction and not sred)
    if spec.reduction and not sred:
        L += [
            f"    out = torch.empty((nb, o_d * o_h * o_w), device=x.device, dtype={tdt})",
            f"    ret = out.reshape((nb,) + (1,) * {spec.keepdim} + (o_d, o_h, o_w)[{pad3}:])",
            "    if out.numel() == 0:",
            "        return ret",
        ]
    elif sred:
        L += [
            f"    out = torch.empty((nb, cout), device=x.device, dtype={tdt})",
            f"    ret = out.reshape((nb, cout) + (1,) * {nd}) if {spec.keepdim} else out",
            "    if out.numel() == 0 or o_d * o_h * o_w == 0:",
            f'        raise ValueError("launch_{name}: a reduction over an empty conv output")' if spec.reduction != "sum"
            else "        return ret.zero_()",
        ]
    else:
        L += [
            f"    out = torch.empty(oshape, device=x.device, dtype={tdt})",
            "    ret = out.reshape(full)",
            "    if out.numel() == 0:",
            "        return ret",
        ]
    if whole:
        L += [
            "    if cout > 256:",
            f'        raise ValueError(f"launch_{name}: a channel reduction keeps all channels in one tile (<= 256), '
            'got {cout}")',
        ]
    args, strides = [], []
    for i, op in enumerate(spec.operands):
        n = op.name
        if op.kind == "scalar":
            L.append(f"    v_{n} = float(extra[{i}])")
            args.append(f"v_{n}")
            continue
        L += [
            "    try:",
            f"        t = torch.broadcast_to(extra[{i}], full)",
            "    except RuntimeError:",
            f'        raise ValueError(f"launch_{name}: operand {n} of shape {{tuple(extra[{i}].shape)}} does not '
            f'broadcast to the output {{full}}") from None',
            f"    t = t.reshape(oshape) if t.dim() == 5 else t[(slice(None), slice(None)) + (None,) * {pad3}]",
            f"    p_{n}, s_{n} = t, t.stride()",
        ]
        args.append(f"p_{n}")
        strides += [f"s_{n}[{j}]" for j in range(5)]
    L += [
        '    bn = max(16, min(int(cfg["BLOCK_N"]), triton.next_power_of_2(cout_g)))',
        "    # narrow channel groups (depthwise) take the FMA path; from DOT_MIN_N channels on, a dot tile of 16",
        "    # columns wastes less than the FMA path loses (and the interpreter runs dots far faster)",
        '    use_dot = cout_g >= int(cfg.get("DOT_MIN_N", 8))',
        "    if not use_dot:",
        "        bn = triton.next_power_of_2(cout_g)",
        *(["    bn = max(bn, triton.next_power_of_2(cout))  # the whole channel row in one tile"]
          if whole else []),
        "    ktot = cin_g * k_d * k_h * k_w",
        '    bk = max(16, min(int(cfg["BLOCK_K"]), triton.next_power_of_2(ktot)))',
        "    # K in (tap, input channel) order, channels innermost, where a dot's K block is filled by channels alone",
        f'    tap_major = use_dot and cin_g >= {TAP_MAJOR_MIN_CIN} and bool(int(cfg.get("TAP_MAJOR", 1)))',
        "    if tap_major:",
        '        bk = max(16, min(int(cfg["BLOCK_K"]), triton.next_power_of_2(cin_g)))',
        '    if tap_major and int(cfg.get("NHWC", 0)) and not lib:',
        "        # channels innermost in memory (a copy of the input and the weight): a tap-major K block then reads",
        "        # a run of channels at stride 1, which the compiler sees and vectorises; NCHW gathers one float at a",
        "        # time across the channels' planes. The kernel takes any strides",
        "        x5 = x5.permute(0, 2, 3, 4, 1).contiguous().permute(0, 4, 1, 2, 3)",
        "        w5 = w5.permute(0, 2, 3, 4, 1).contiguous().permute(0, 4, 1, 2, 3)",
        "    if not use_dot:",
        "        bk = min(bk, max(1, 4096 // (bn * 32)))  # the [BM, BK, BN] product stays in registers",
        "        bk = max(1, min(bk, triton.next_power_of_2(ktot)))",
        "    m = nb * o_d * o_h * o_w",
        f'    bm = max(16, min(int(cfg["BLOCK_M"]), triton.next_power_of_2({"o_d * o_h * o_w" if sred else "m"})))',
        "    if not use_dot:",
        "        bm = min(bm, 128)",
        *(["    bm = max(16, min(bm, 8192 // bn))  # a wide channel row: fewer pixels keep the tile in registers"]
          if whole else []),
        "    big = max(x5.numel(), m * cout, *(t.numel() for t in extra if isinstance(t, torch.Tensor))) >= 2**31 - 1",
    ]
    if sred:
        L += [
            "    tps = triton.cdiv(o_d * o_h * o_w, bm)",
            "    ws = torch.empty((nb, tps, cout), device=x.device, dtype=torch.float32)",
            "    grid = (nb * tps * triton.cdiv(cout_g, bn), groups)",
        ]
    elif _subpixel(spec):
        L += [
            "    # every tile once per output phase (the phases innermost), sized for the largest phase",
            f"    qmax = nb * -(-o_d // {stride[0]}) * -(-o_h // {stride[1]}) * -(-o_w // {stride[2]})",
            f"    grid = (triton.cdiv(qmax, bm) * triton.cdiv(cout_g, bn) * {stride[0] * stride[1] * stride[2]}, groups)",
        ]
    else:
        L.append("    grid = (triton.cdiv(m, bm) * triton.cdiv(cout_g, bn), groups)")
    L += [
        "    kx = y5 if lib else x5" if follow == "cudnn" else "    kx = x5",
        f"    {name}_kernel[grid](",
        f"        kx, w5, out, {'ws, ' if sred else ''}",
        *[f"        {a}," for a in args],
        "        nb, i_d, i_h, i_w, cout, o_d, o_h, o_w,",
        "        *kx.stride(), *w5.stride(),",
        *[f"        {s}," for s in strides],
        "        CIN_G=cin_g, COUT_G=cout_g, KD=k_d, KH=k_h, KW=k_w,",
        f"        SD={stride[0]}, SH={stride[1]}, SW={stride[2]}, PD={padding[0]}, PH={padding[1]}, PW={padding[2]},",
        f"        DD={dilation[0]}, DH={dilation[1]}, DW={dilation[2]}, TRANSPOSED={spec.transposed}, SUBPIX={_subpixel(spec)},",
        f"        USE_DOT=use_dot, UPCAST=({spec.dtype == 'bfloat16'} and not x.is_cuda), BIG=big, TF32RN=rn, RNA_ASM=x.is_cuda,",
        "        LIBRARY=lib, TAP_MAJOR=tap_major,",
        '        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=int(cfg["GROUP_M"]),',
        '        num_warps=int(cfg["num_warps"]), num_stages=int(cfg["num_stages"]),',
        "    )",
    ]
    if sred:
        L += [
            "    bt = min(64, triton.next_power_of_2(tps))",
            "    bc = min(64, triton.next_power_of_2(cout))",
            f"    {name}_finish[(nb, triton.cdiv(cout, bc))](ws, out, cout, tps, o_d * o_h * o_w, BLOCK_T=bt, BLOCK_C=bc)",
        ]
    L += ["    return ret", ""]
    return (TF32_FLAGS_SRC + "\n\n" if follow else "") + "\n".join(L)


def conv_kernel(spec: ConvSpec) -> KernelSource:
    """Generate the Triton kernel and its launcher ``launch_<name>(x, w, *operands, config=None)``."""
    _check(spec)
    config = default_config(spec)
    return KernelSource(
        name=spec.name, kernel_src=_kernel_src(spec), launcher_src=_launcher_src(spec, config),
        config=dict(config), space=space(spec), kernel_name=f"{spec.name}_kernel",
        launcher_name=f"launch_{spec.name}", output="matrix",
    )
