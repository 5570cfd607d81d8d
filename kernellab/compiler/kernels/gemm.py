"""GEMM Triton templates: ``gemm_kernel(spec) -> KernelSource`` (kernel text + launcher text).

One template covers mm / bmm / linear (``trans_b``) with a fused pointwise epilogue over extra operands
(row vector, column vector, matrix, scalar), and GEMM + row reduction over N (softmax, log_softmax,
logsumexp, sum, max, layernorm) with a row epilogue: the fusion torch.compile does not make.

Layout and the two "fixups" (why the kernel looks the way it does):
- Tiles are ordered in groups of ``GROUP_M`` row blocks (L2 reuse of B), masks handle any M, N, K.
- Row reduction: when ``BLOCK_N >= N`` the whole row is in the tile and is reduced in registers.
  Otherwise the grid stays a full GEMM grid (a grid over M alone would leave most SMs idle at
  M = 4096): each tile writes its per-row partial statistics (max/sum-exp, sum, max, or mean/M2 by
  Chan's formula) to a small workspace, then takes a ticket on a per-row-block counter; the tile that
  arrives last combines the statistics and, for softmax/log_softmax/layernorm, normalises the row
  block that the other tiles stored a moment ago (still in L2). No tile ever waits on another, so
  this cannot deadlock; counters reset themselves, so no memset kernel runs per call.
- Split-K (``SPLIT_K > 1``) uses the same ticket scheme per output tile: the last split sums the
  partials in a fixed order (deterministic) and applies the epilogue once.
- Persistent (``spec.persistent``): a grid of about one program per SM loops over the work items.

Numerics: fp32 accumulation always; for float32, ``tl.dot(input_precision="ieee")`` unless
``allow_tf32`` (then "tf32"); ``fp32_precision="tf32x3"`` opts into the 3-pass TF32 split, which
keeps ~fp32 accuracy on the tensor cores (measure before relying on it).
"""

from __future__ import annotations

import ast
import importlib.util
import keyword
import re
import sys
import tempfile
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Operand",
    "GemmSpec",
    "KernelSource",
    "gemm_kernel",
    "load_kernel",
    "ROW_REDUCTIONS",
    "VECTOR_REDUCTIONS",
    "OPERAND_KINDS",
    "DTYPES",
]

DTYPES = ("float32", "float16", "bfloat16")
OPERAND_KINDS = ("row", "col", "matrix", "scalar")
ROW_REDUCTIONS = (None, "softmax", "log_softmax", "logsumexp", "sum", "max", "layernorm")
# reductions that leave one value per row: output [M] (or [B, M])
VECTOR_REDUCTIONS = ("logsumexp", "sum", "max")
FP32_PRECISIONS = ("ieee", "tf32", "tf32x3")

# Names the template itself binds in the helper functions' scope; operands may not shadow them.
_RESERVED = {"acc", "tl", "triton", "torch", "math"}


@dataclass(frozen=True)
class Operand:
    """An extra input of the epilogue. ``kind``: "row" ([N], e.g. a bias), "col" ([M]),
    "matrix" ([M, N], e.g. a residual; [B, M, N] when batched) or "scalar" (a Python float)."""

    name: str
    kind: str


@dataclass(frozen=True)
class GemmSpec:
    """What to generate. a is [M, K] ([B, M, K] when ``batched``); b is [K, N], or [N, K] when
    ``trans_b`` (an nn.Linear weight). ``epilogue``/``row_epilogue``: Triton statements, one per
    line, reading ``acc`` (fp32) and the operands by name and assigning ``acc``."""

    name: str
    batched: bool = False
    trans_b: bool = False
    dtype: str = "float32"
    allow_tf32: bool = False
    operands: tuple[Operand, ...] = ()
    epilogue: str = ""
    row_reduction: str | None = None
    row_epilogue: str = ""
    split_k: int = 1  # > 1: default SPLIT_K of the split-K variant, and SPLIT_K enters the SPACE
    persistent: bool = False  # about one program per SM, looping over the tiles
    fp32_precision: str | None = None  # None: "tf32" if allow_tf32 else "ieee"


@dataclass(frozen=True)
class KernelSource:
    """Generated text. ``kernel_src`` holds the ``@triton.jit`` helpers and kernel, ``launcher_src``
    the function ``launch_<name>(a, b, *extra, out=None, config=None)``; both assume
    ``import torch, triton, triton.language as tl`` at the top of the file."""

    name: str
    kernel_src: str
    launcher_src: str
    config: dict[str, Any]
    space: dict[str, list]
    kernel_name: str = ""
    launcher_name: str = ""
    output: str = "matrix"  # "matrix" ([M, N] / [B, M, N]) or "vector" ([M] / [B, M])

    @property
    def source(self) -> str:
        """Kernel and launcher, ready to paste below the imports."""
        return self.kernel_src + "\n\n" + self.launcher_src


# ----------------------------------------------------------------------------------------- checks


def _check(spec: GemmSpec) -> None:
    where = f"GemmSpec {spec.name!r}"
    if not spec.name.isidentifier() or keyword.iskeyword(spec.name):
        raise ValueError(f"{where}: name must be a Python identifier")
    if spec.dtype not in DTYPES:
        raise ValueError(f"{where}: dtype {spec.dtype!r} not in {DTYPES}")
    if spec.row_reduction not in ROW_REDUCTIONS:
        raise ValueError(f"{where}: row_reduction {spec.row_reduction!r} not in {ROW_REDUCTIONS}")
    if spec.fp32_precision is not None and spec.fp32_precision not in FP32_PRECISIONS:
        raise ValueError(f"{where}: fp32_precision {spec.fp32_precision!r} not in {FP32_PRECISIONS}")
    if spec.split_k < 1:
        raise ValueError(f"{where}: split_k must be >= 1")
    if spec.split_k > 1 and spec.row_reduction is not None:
        raise ValueError(f"{where}: split_k > 1 cannot be combined with a row_reduction")
    seen = set()
    for op in spec.operands:
        if not isinstance(op, Operand):
            raise TypeError(f"{where}: operands must be Operand instances, got {op!r}")
        if op.kind not in OPERAND_KINDS:
            raise ValueError(f"{where}: operand {op.name!r} kind {op.kind!r} not in {OPERAND_KINDS}")
        if not op.name.isidentifier() or keyword.iskeyword(op.name) or op.name in _RESERVED:
            raise ValueError(f"{where}: operand name {op.name!r} is not a free identifier")
        if op.name in seen:
            raise ValueError(f"{where}: operand {op.name!r} appears twice")
        seen.add(op.name)
    if spec.row_reduction == "layernorm":
        for op in spec.operands:
            if op.name in ("ln_weight", "ln_bias") and op.kind != "row":
                raise ValueError(f"{where}: {op.name} must be an operand of kind 'row'")
    for label, text in (("epilogue", spec.epilogue), ("row_epilogue", spec.row_epilogue)):
        try:
            ast.parse(textwrap.dedent(text))
        except SyntaxError as e:
            raise ValueError(f"{where}: {label} is not valid Python: {e}") from None
    if spec.row_epilogue.strip() and spec.row_reduction is None:
        raise ValueError(f"{where}: row_epilogue needs a row_reduction")
    if spec.row_reduction in VECTOR_REDUCTIONS:
        for op in spec.operands:
            if op.kind in ("row", "matrix") and re.search(rf"\b{op.name}\b", spec.row_epilogue):
                raise ValueError(
                    f"{where}: row_epilogue after {spec.row_reduction} sees one value per row; "
                    f"it cannot read the {op.kind} operand {op.name!r}"
                )


# ----------------------------------------------------------------------------------------- helpers


def _indent(lines: list[str], n: int) -> list[str]:
    pad = " " * (4 * n)
    return [pad + ln if ln else ln for ln in lines]


def _stmts(text: str) -> list[str]:
    return [ln.rstrip() for ln in textwrap.dedent(text).strip("\n").splitlines() if ln.strip()]


def _helper(fn: str, params: list[str], body: str) -> list[str]:
    return ["@triton.jit", f"def {fn}({', '.join(params)}):", *_indent(_stmts(body), 1), "    return acc", ""]


def _load_ops(spec: GemmSpec, offs_n: str, mask_n: str, sfx: str = "") -> list[str]:
    """Load every tensor operand for the tile (rows offs_m, columns ``offs_n``) as fp32 and broadcast
    it to [BLOCK_M, BLOCK_N]; column vectors also stay available as [BLOCK_M] (``o_<name>_v``)."""
    out = []
    for op in spec.operands:
        n, v = op.name, f"o_{op.name}{sfx}"
        if op.kind == "row":
            out.append(
                f"{v} = tl.load(p_{n} + pid_b64 * s_{n}_b + {offs_n} * s_{n}_n, mask={mask_n}, other=0.0).to(tl.float32)"
            )
            out.append(f"{v} = tl.broadcast_to({v}[None, :], (BLOCK_M, BLOCK_N))")
        elif op.kind == "col":
            out.append(
                f"o_{n}_v = tl.load(p_{n} + pid_b64 * s_{n}_b + offs_m * s_{n}_m, mask=mask_m, other=0.0).to(tl.float32)"
            )
            out.append(f"{v} = tl.broadcast_to(o_{n}_v[:, None], (BLOCK_M, BLOCK_N))")
        elif op.kind == "matrix":
            out.append(
                f"{v} = tl.load(p_{n} + pid_b64 * s_{n}_b + offs_m[:, None] * s_{n}_m + {offs_n}[None, :] * s_{n}_n, "
                f"mask=mask_m[:, None] & {mask_n}[None, :], other=0.0).to(tl.float32)"
            )
    return out


def _op_args(spec: GemmSpec, sfx: str = "", vector: bool = False) -> list[str]:
    args = []
    for op in spec.operands:
        if op.kind == "scalar":
            args.append(f"v_{op.name}")
        elif vector:
            if op.kind == "col":
                args.append(f"o_{op.name}_v")
        else:
            args.append(f"o_{op.name}{sfx}")
    return args


def _call(fn: str, first: str, args: list[str]) -> str:
    return f"{first} = {fn}({', '.join([first, *args])})"


def _fp32_precision(spec: GemmSpec) -> str:
    return spec.fp32_precision or ("tf32" if spec.allow_tf32 else "ieee")


# ------------------------------------------------------------------------------ configs and space


def _default_config(spec: GemmSpec) -> dict[str, Any]:
    half = spec.dtype != "float32"
    heavy_epilogue = any(op.kind == "matrix" for op in spec.operands)
    if spec.row_reduction is not None:
        # 128x128 tiles keep a full GEMM grid; rows longer than 128 go through the ticket fixup.
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64 if half else 32, GROUP_M=8, num_warps=8, num_stages=3)
    elif half:
        # Hopper wgmma: 128x256x64, 8 warps (two warpgroups), 3 stages = 144 KiB of shared memory, the
        # Triton tutorials' best bf16/fp16 tile on H100; a matrix operand adds a 128xBN fp32 tile of
        # registers, so it gets 128x128.
        cfg = dict(BLOCK_M=128, BLOCK_N=128 if heavy_epilogue else 256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    else:
        # fp32: IEEE dot runs on the FMA units (tf32 on tensor cores); K=32 keeps 4-byte tiles at 32 KiB a stage.
        cfg = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=8, num_stages=3)
    if spec.row_reduction is None:
        cfg["SPLIT_K"] = spec.split_k
    if spec.row_reduction == "layernorm":
        cfg["eps"] = 1e-5
    if spec.persistent:
        cfg["NUM_PROGS"] = 0  # 0: one program per SM of the device
    return cfg


def _space(spec: GemmSpec) -> dict[str, list]:
    half = spec.dtype != "float32"
    space: dict[str, list] = {
        "BLOCK_M": [32, 64, 128, 256] if spec.row_reduction else [64, 128, 256],
        "BLOCK_N": [64, 128, 256],
        "BLOCK_K": [32, 64, 128] if half else [16, 32, 64],
        "GROUP_M": [1, 8],
        "num_warps": [4, 8],
        "num_stages": [2, 3, 4, 5] if half else [2, 3, 4],
    }
    if spec.split_k > 1:
        space["SPLIT_K"] = [1, 2, 4, 8, 16]
    return space


# --------------------------------------------------------------------------------- kernel text


def _reduce_one_tile(spec: GemmSpec) -> list[str]:
    """Whole row in registers: reduce ``acc`` ([BLOCK_M, BLOCK_N], columns >= N masked)."""
    r = spec.row_reduction
    ninf = 'float("-inf")'
    if r in ("softmax", "log_softmax", "logsumexp"):
        lines = [
            f"xm = tl.where(mask_n[None, :], acc, {ninf})",
            "r_max = tl.max(xm, 1)",
            f"r_safe = tl.where(r_max == {ninf}, 0.0, r_max)",
            "e = tl.exp(xm - r_safe[:, None])",
            "r_sum = tl.sum(e, 1)",
        ]
        if r == "softmax":
            lines.append("acc = e / r_sum[:, None]")
        elif r == "log_softmax":
            lines.append("acc = xm - (r_safe + tl.log(r_sum))[:, None]")
        else:
            lines.append("vec = r_safe + tl.log(r_sum)")
        return lines
    if r == "sum":
        return ["vec = tl.sum(tl.where(mask_n[None, :], acc, 0.0), 1)"]
    if r == "max":
        return [f"vec = tl.max(tl.where(mask_n[None, :], acc, {ninf}), 1)"]
    # layernorm: two passes over the registers (mean, then centred variance), biased variance like torch
    lines = [
        "n_f = N * 1.0",
        "mean = tl.sum(tl.where(mask_n[None, :], acc, 0.0), 1) / n_f",
        "xc = tl.where(mask_n[None, :], acc - mean[:, None], 0.0)",
        "rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, 1) / n_f + EPS)",
        "acc = xc * rstd[:, None]",
    ]
    return lines + _ln_affine(spec, "")


def _ln_affine(spec: GemmSpec, sfx: str) -> list[str]:
    names = {op.name for op in spec.operands}
    out = []
    if "ln_weight" in names:
        out.append(f"acc = acc * o_ln_weight{sfx}")
    if "ln_bias" in names:
        out.append(f"acc = acc + o_ln_bias{sfx}")
    return out


def _tile_stats(r: str) -> list[str]:
    """Per-row partial statistics of this tile: st0, st1 ([BLOCK_M])."""
    ninf = 'float("-inf")'
    if r in ("softmax", "log_softmax", "logsumexp"):
        return [
            f"xm = tl.where(mask_n[None, :], acc, {ninf})",
            "st0 = tl.max(xm, 1)",
            f"st_safe = tl.where(st0 == {ninf}, 0.0, st0)",
            "st1 = tl.sum(tl.exp(xm - st_safe[:, None]), 1)",
        ]
    if r == "sum":
        return ["st0 = tl.sum(tl.where(mask_n[None, :], acc, 0.0), 1)"]
    if r == "max":
        return [f"st0 = tl.max(tl.where(mask_n[None, :], acc, {ninf}), 1)"]
    return [  # layernorm: tile mean and sum of squared deviations (Chan et al. combine them exactly)
        "cnt = tl.minimum(N - pid_n * BLOCK_N, BLOCK_N) * 1.0",
        "st0 = tl.sum(tl.where(mask_n[None, :], acc, 0.0), 1) / cnt",
        "dev = tl.where(mask_n[None, :], acc - st0[:, None], 0.0)",
        "st1 = tl.sum(dev * dev, 1)",
    ]


def _combine(r: str) -> list[str]:
    """Fold tile j's statistics (c0, c1) into the running ones (r0, r1)."""
    ninf = 'float("-inf")'
    if r in ("softmax", "log_softmax", "logsumexp"):
        return [
            "m_new = tl.maximum(r0, c0)",
            f"m_safe = tl.where(m_new == {ninf}, 0.0, m_new)",
            "r1 = r1 * tl.exp(r0 - m_safe) + c1 * tl.exp(c0 - m_safe)",
            "r0 = m_new",
        ]
    if r == "sum":
        return ["r0 = r0 + c0"]
    if r == "max":
        return ["r0 = tl.maximum(r0, c0)"]
    return [
        "n_a = (j * BLOCK_N) * 1.0  # j is an int in the interpreter, a tensor when compiled",
        "n_b = tl.minimum(N - j * BLOCK_N, BLOCK_N) * 1.0",
        "n_ab = n_a + n_b",
        "delta = c0 - r0",
        "r0 = r0 + delta * (n_b / n_ab)",
        "r1 = r1 + c1 + delta * delta * (n_a * n_b / n_ab)",
    ]


def _finalize(r: str) -> list[str]:
    ninf = 'float("-inf")'
    if r in ("softmax", "log_softmax", "logsumexp"):
        return [f"m_fin = tl.where(r0 == {ninf}, 0.0, r0)", "lse = m_fin + tl.log(r1)"]
    if r == "layernorm":
        return ["rstd = 1.0 / tl.sqrt(r1 / (N * 1.0) + EPS)"]
    return []


def _normalize(spec: GemmSpec) -> list[str]:
    """Turn a re-read chunk ``acc`` of the row into the final values (after _finalize)."""
    r = spec.row_reduction
    if r == "softmax":
        return ["acc = tl.exp(acc - m_fin[:, None]) / r1[:, None]"]
    if r == "log_softmax":
        return ["acc = acc - lse[:, None]"]
    return ["acc = (acc - r0[:, None]) * rstd[:, None]", *_ln_affine(spec, "_j")]


def _kernel_src(spec: GemmSpec) -> str:
    name = spec.name
    r = spec.row_reduction
    vector = r in VECTOR_REDUCTIONS
    two_stats = r in ("softmax", "log_softmax", "logsumexp", "layernorm")
    epi_fn, repi_fn, kname = f"_{name}_epilogue", f"_{name}_row_epilogue", f"{name}_kernel"
    has_epi, has_repi = bool(_stmts(spec.epilogue)), bool(_stmts(spec.row_epilogue))

    helpers: list[str] = []
    op_params = [op.name for op in spec.operands]
    if has_epi:
        helpers += _helper(epi_fn, ["acc", *op_params], spec.epilogue)
    if has_repi:
        vparams = [op.name for op in spec.operands if not vector or op.kind in ("col", "scalar")]
        helpers += _helper(repi_fn, ["acc", *vparams], spec.row_epilogue)

    params = ["a_ptr", "b_ptr", "out_ptr", "ws_ptr", "cnt_ptr"]
    strides = []
    for op in spec.operands:
        n = op.name
        if op.kind == "scalar":
            params.append(f"v_{n}")
        else:
            params.append(f"p_{n}")
            strides.append(f"s_{n}_b")
            strides += {"row": [f"s_{n}_n"], "col": [f"s_{n}_m"], "matrix": [f"s_{n}_m", f"s_{n}_n"]}[op.kind]
    params += ["M", "N", "K", "B"]
    params += ["stride_ab", "stride_am", "stride_ak", "stride_bb", "stride_bk", "stride_bn"]
    params += ["stride_ob", "stride_om", "stride_on", *strides]
    consts = ["BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "EVEN_K"]
    if r is not None:
        consts.append("ONE_N_TILE")
    if r == "layernorm":
        consts.append("EPS")
    if spec.dtype == "bfloat16":
        consts.append("UPCAST_DOT")
    params += [f"{c}: tl.constexpr" for c in consts]

    if spec.dtype == "float32":
        dot = [f'acc = tl.dot(a, b, acc, input_precision="{_fp32_precision(spec)}")']
    elif spec.dtype == "bfloat16":
        # Triton 3.6's interpreter multiplies bf16 tiles as their raw uint16 bits; upcasting there is
        # exact (a bf16 product fits fp32). Compiled kernels keep the bf16 tensor-core dot.
        dot = [
            "if UPCAST_DOT:",
            '    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")',
            "else:",
            "    acc = tl.dot(a, b, acc)",
        ]
    else:
        dot = ["acc = tl.dot(a, b, acc)"]

    # ---- one work item: (batch, split, tile) -> accumulator
    body = [
        "pid_b = w // (tiles * SPLIT_K)",
        "rem = w - pid_b * (tiles * SPLIT_K)",
        "pid_k = rem // tiles",
        "t = rem - pid_k * tiles",
        "# grouped ordering: GROUP_M row blocks sweep the columns together, so B tiles are reused from L2",
        "group_span = GROUP_M * num_pid_n",
        "first_m = (t // group_span) * GROUP_M",
        "group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)",
        "pid_m = first_m + (t % group_span) % group_rows",
        "pid_n = (t % group_span) // group_rows",
        "pid_b64 = pid_b.to(tl.int64)",
        "offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
        "offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
        "mask_m = offs_m < M",
        "mask_n = offs_n < N",
        "# clamped indices keep the K loop free of M/N masks; the hints let loads vectorise",
        "offs_am = tl.max_contiguous(tl.multiple_of(tl.where(mask_m, offs_m, 0), BLOCK_M), BLOCK_M)",
        "offs_bn = tl.max_contiguous(tl.multiple_of(tl.where(mask_n, offs_n, 0), BLOCK_N), BLOCK_N)",
        "offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)",
        "a_ptrs = a_ptr + pid_b64 * stride_ab + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak",
        "b_ptrs = b_ptr + pid_b64 * stride_bb + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn",
        "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
        "for kt in range(pid_k, tl.cdiv(K, BLOCK_K), SPLIT_K):",
        "    if EVEN_K:",
        "        a = tl.load(a_ptrs)",
        "        b = tl.load(b_ptrs)",
        "    else:",
        "        k_left = K - kt * BLOCK_K",
        "        a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)",
        "        b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)",
        *_indent(dot, 1),
        "    a_ptrs += (BLOCK_K * SPLIT_K) * stride_ak",
        "    b_ptrs += (BLOCK_K * SPLIT_K) * stride_bk",
    ]
    out_tile = "out_ptr + pid_b64 * stride_ob + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on"
    store_tile = f"tl.store({out_tile}, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])"
    epi = [_call(epi_fn, "acc", _op_args(spec))] if has_epi else []

    if r is None:
        finish_direct = [*_load_ops(spec, "offs_n", "mask_n"), *epi, store_tile]
        # split-K: partials to the workspace, the last split of a tile sums them in a fixed order
        finish_split = [
            "tile_id = pid_b * tiles + t",
            "tile_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]",
            "ws_tile = ws_ptr + tile_id.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)",
            "tl.store(ws_tile + pid_k * (BLOCK_M * BLOCK_N) + tile_offs, acc)",
            "# every thread's partial is written before the ticket (release); the last one reads through L2",
            "tl.debug_barrier()",
            'ticket = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel")',
            "if ticket == SPLIT_K - 1:",
            "    tl.atomic_xchg(cnt_ptr + tile_id, 0)",
            "    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
            "    for s in tl.static_range(SPLIT_K):",
            '        acc += tl.load(ws_tile + s * (BLOCK_M * BLOCK_N) + tile_offs, cache_modifier=".cg")',
            *_indent([*_load_ops(spec, "offs_n", "mask_n"), *epi, store_tile], 1),
        ]
        finish = [
            "if SPLIT_K == 1:",
            *_indent(finish_direct, 1),
            "else:",
            *_indent(finish_split, 1),
        ]
    else:
        if vector:
            repi_one = [_call(repi_fn, "vec", _op_args(spec, vector=True))] if has_repi else []
            store_vec = (
                "tl.store(out_ptr + pid_b64 * stride_ob + offs_m * stride_om, "
                "vec.to(out_ptr.dtype.element_ty), mask=mask_m)"
            )
            one = [*_reduce_one_tile(spec), *repi_one, store_vec]
        else:
            repi_one = [_call(repi_fn, "acc", _op_args(spec))] if has_repi else []
            one = [*_reduce_one_tile(spec), *repi_one, store_tile]
        init0 = 'float("-inf")' if r == "max" else "0.0"  # masked rows only: keeps them finite
        multi = [
            *_tile_stats(r),
            *([store_tile] if not vector else []),  # the raw row values, normalised by the last tile
            "row_ws = ws_ptr + (pid_b64 * M + offs_m) * num_pid_n",
            "ws_plane = B * M * num_pid_n",
            "tl.store(row_ws + pid_n, st0, mask=mask_m)",
            *(["tl.store(row_ws + ws_plane + pid_n, st1, mask=mask_m)"] if two_stats else []),
            "# every thread's stores land before the ticket (release); the last tile reads through L2",
            "tl.debug_barrier()",
            "blk = pid_b * num_pid_m + pid_m",
            'ticket = tl.atomic_add(cnt_ptr + blk, 1, sem="acq_rel")',
            "if ticket == num_pid_n - 1:",
            "    tl.atomic_xchg(cnt_ptr + blk, 0)",
            f'    r0 = tl.load(row_ws, mask=mask_m, other={init0}, cache_modifier=".cg")',
            *(['    r1 = tl.load(row_ws + ws_plane, mask=mask_m, other=1.0, cache_modifier=".cg")'] if two_stats else []),
            "    for j in range(1, num_pid_n):",
            f'        c0 = tl.load(row_ws + j, mask=mask_m, other={init0}, cache_modifier=".cg")',
            *(['        c1 = tl.load(row_ws + ws_plane + j, mask=mask_m, other=1.0, cache_modifier=".cg")'] if two_stats else []),
            *_indent(_combine(r), 2),
            *_indent(_finalize(r), 1),
        ]
        if vector:
            vec_of = {"logsumexp": "lse", "sum": "r0", "max": "r0"}[r]
            multi += _indent([f"vec = {vec_of}", *repi_one, store_vec], 1)
        else:
            # fresh names (y, offs_nj, ...) so the loop carries no [BLOCK_M, BLOCK_N] value from outside
            tile_j = out_tile.replace("offs_n[", "offs_nj[")
            chunk = [
                "offs_nj = j * BLOCK_N + tl.arange(0, BLOCK_N)",
                "mask_nj = offs_nj < N",
                "o_mask = mask_m[:, None] & mask_nj[None, :]",
                *(_load_ops(spec, "offs_nj", "mask_nj", "_j") if (has_repi or r == "layernorm") else []),
                f'y = tl.load({tile_j}, mask=o_mask, other=0.0, cache_modifier=".cg").to(tl.float32)',
                *[re.sub(r"\bacc\b", "y", ln) for ln in _normalize(spec)],
                *([_call(repi_fn, "y", _op_args(spec, "_j"))] if has_repi else []),
                f"tl.store({tile_j}, y.to(out_ptr.dtype.element_ty), mask=o_mask)",
            ]
            multi += _indent(["for j in range(0, num_pid_n):", *_indent(chunk, 1)], 1)
        finish = [
            *_load_ops(spec, "offs_n", "mask_n"),
            *epi,
            "if ONE_N_TILE:",
            *_indent(one, 1),
            "else:",
            *_indent(multi, 1),
        ]

    head = [
        "@triton.jit",
        f"def {kname}(",
        *_indent([p + "," for p in params], 1),
        "):",
        "    num_pid_m = tl.cdiv(M, BLOCK_M)",
        "    num_pid_n = tl.cdiv(N, BLOCK_N)",
        "    tiles = num_pid_m * num_pid_n",
    ]
    if spec.persistent:
        loop = [
            "    # persistent: about one program per SM walks the work items",
            "    for w in range(tl.program_id(0), B * tiles * SPLIT_K, tl.num_programs(0)):",
            *_indent(body + finish, 2),
        ]
    else:
        loop = ["    w = tl.program_id(0)", *_indent(body + finish, 1)]
    return "\n".join(helpers + head + loop) + "\n"


# --------------------------------------------------------------------------------- launcher text


def _launcher_src(spec: GemmSpec, config: dict[str, Any]) -> str:
    name, r = spec.name, spec.row_reduction
    vector = r in VECTOR_REDUCTIONS
    tdt = f"torch.{spec.dtype}"
    nd = 3 if spec.batched else 2
    L: list[str] = [
        f"def launch_{name}(a, b, *extra, out=None, config=None):",
        f'    """{name}: {"batched " if spec.batched else ""}GEMM a @ {"b.T" if spec.trans_b else "b"}'
        f'{" + epilogue" if _stmts(spec.epilogue) else ""}{" + row " + r if r else ""}."""',
        f"    cfg = {{**{config!r}, **(config or {{}})}}",
        f"    if len(extra) != {len(spec.operands)}:",
        f'        raise TypeError(f"launch_{name}: expected {len(spec.operands)} extra operand(s) '
        f'({", ".join(op.name for op in spec.operands)}), got {{len(extra)}}")',
        "    for nm, t in (('a', a), ('b', b)):",
        f"        if not isinstance(t, torch.Tensor) or t.dim() != {nd}:",
        f'            raise ValueError(f"launch_{name}: {{nm}} must be a {nd}-D tensor, got {{getattr(t, \'shape\', type(t))}}")',
        f"        if t.dtype != {tdt}:",
        f'            raise TypeError(f"launch_{name}: {{nm}} has dtype {{t.dtype}}, expected {tdt}")',
        "    if b.device != a.device:",
        f'        raise ValueError(f"launch_{name}: a on {{a.device}} but b on {{b.device}}")',
    ]
    if spec.batched:
        L += [
            "    B = max(a.shape[0], b.shape[0])",
            "    if a.shape[0] not in (1, B) or b.shape[0] not in (1, B):",
            f'        raise ValueError(f"launch_{name}: batch sizes {{a.shape[0]}} and {{b.shape[0]}} do not broadcast")',
            "    M, K = a.shape[1], a.shape[2]",
            "    sab = a.stride(0) if a.shape[0] > 1 else 0",
            "    sbb = b.stride(0) if b.shape[0] > 1 else 0",
            "    sam, sak = a.stride(1), a.stride(2)",
        ]
        bi = (1, 2)
    else:
        L += ["    B = 1", "    M, K = a.shape", "    sab = sbb = 0", "    sam, sak = a.stride(0), a.stride(1)"]
        bi = (0, 1)
    if spec.trans_b:  # b is [N, K]: the kernel reads it through swapped strides, no copy
        L += [f"    N, Kb = b.shape[{bi[0]}], b.shape[{bi[1]}]", f"    sbk, sbn = b.stride({bi[1]}), b.stride({bi[0]})"]
    else:
        L += [f"    Kb, N = b.shape[{bi[0]}], b.shape[{bi[1]}]", f"    sbk, sbn = b.stride({bi[0]}), b.stride({bi[1]})"]
    L += [
        "    if Kb != K:",
        f'        raise ValueError(f"launch_{name}: inner dimensions differ: a {{tuple(a.shape)}}, b {{tuple(b.shape)}}'
        f'{" (b is [N, K])" if spec.trans_b else ""}")',
    ]
    oshape = ("(B, M)" if spec.batched else "(M,)") if vector else ("(B, M, N)" if spec.batched else "(M, N)")
    L += [
        f"    oshape = {oshape}",
        "    if out is None:",
        f"        out = torch.empty(oshape, device=a.device, dtype={tdt})",
        f"    elif tuple(out.shape) != oshape or out.dtype != {tdt}:",
        f'        raise ValueError(f"launch_{name}: out must be {{oshape}} {tdt}, got {{tuple(out.shape)}} {{out.dtype}}")',
    ]
    if vector:
        L.append(
            "    sob, som, son = (out.stride(0), out.stride(1), 0)" if spec.batched else "    sob, som, son = 0, out.stride(0), 0"
        )
    else:
        L.append(
            "    sob, som, son = out.stride()" if spec.batched else "    sob, (som, son) = 0, out.stride()"
        )
    # operands: broadcast to their full shape (stride 0 where broadcast), so a [N] bias serves a batched GEMM
    args, strides = [], []
    for i, op in enumerate(spec.operands):
        n = op.name
        if op.kind == "scalar":
            L += [
                f"    if isinstance(extra[{i}], torch.Tensor) and extra[{i}].numel() != 1:",
                f'        raise TypeError("launch_{name}: scalar operand {n} must be a number")',
                f"    v_{n} = float(extra[{i}])",
            ]
            args.append(f"v_{n}")
            continue
        full = {
            "row": "(B, N)" if spec.batched else "(N,)",
            "col": "(B, M)" if spec.batched else "(M,)",
            "matrix": "(B, M, N)" if spec.batched else "(M, N)",
        }[op.kind]
        L += [
            f"    t = extra[{i}]",
            "    if not isinstance(t, torch.Tensor) or t.device != a.device or not t.is_floating_point():",
            f'        raise TypeError(f"launch_{name}: operand {n} must be a floating tensor on {{a.device}}")',
        ]
        if op.kind == "row":  # accept [N], [1, N] and the keepdim form [B, 1, N]
            L += ["    if t.dim() >= 2 and t.shape[-2] == 1:", "        t = t.squeeze(-2)"]
        if op.kind == "col":  # accept [M], and the keepdim forms [M, 1], [B, M, 1]
            L += ["    if t.dim() >= 2 and t.shape[-1] == 1:", "        t = t.squeeze(-1)"]
        L += [
            "    try:",
            f"        t = torch.broadcast_to(t, {full})",
            "    except RuntimeError:",
            f'        raise ValueError(f"launch_{name}: {op.kind} operand {n} of shape {{tuple(extra[{i}].shape)}} '
            f'does not broadcast to {full}") from None',
            f"    p_{n} = t",
        ]
        if spec.batched:
            L.append(f"    s_{n} = t.stride()")
        else:
            L.append(f"    s_{n} = (0,) + t.stride()")
        args.append(f"p_{n}")
        k = {"row": 2, "col": 2, "matrix": 3}[op.kind]
        strides += [f"s_{n}[{j}]" for j in range(k)]
    L += [
        "    if B == 0 or M == 0:",
        "        return out",
        "    if N == 0:",
        f'        raise ValueError("launch_{name}: a row reduction over N = 0 columns is undefined")'
        if r is not None
        else "        return out",
        "    # tl.dot needs >= 16 in every tile dimension; smaller problems get smaller tiles",
        '    BM = max(16, min(int(cfg["BLOCK_M"]), triton.next_power_of_2(M)))',
        '    BN = max(16, min(int(cfg["BLOCK_N"]), triton.next_power_of_2(N)))',
        '    BK = max(16, min(int(cfg["BLOCK_K"]), triton.next_power_of_2(max(K, 1))))',
        '    SK = max(1, int(cfg.get("SPLIT_K", 1)))' if r is None else "    SK = 1",
        "    tiles = triton.cdiv(M, BM) * triton.cdiv(N, BN)",
        "    work = B * tiles * SK",
        "    ws, cnt = a, a  # placeholders, never read unless a fixup runs",
    ]
    one_tile = "BN >= N"
    if r is None:
        L += [
            "    if SK > 1:",
            "        ws = torch.empty(work * BM * BN, device=a.device, dtype=torch.float32)",
            "        n_cnt = B * tiles",
        ]
    else:
        L += [
            f"    if not ({one_tile}):",
            f"        ws = torch.empty({2 if r in ('softmax', 'log_softmax', 'logsumexp', 'layernorm') else 1} * B * M * triton.cdiv(N, BN), "
            "device=a.device, dtype=torch.float32)",
            "        n_cnt = B * triton.cdiv(M, BM)",
        ]
    L += [
        f"    if {'SK > 1' if r is None else f'not ({one_tile})'}:",
        "        # ticket counters: zeroed once per device, every use leaves them at zero again",
        f"        cache = launch_{name}.__dict__.setdefault('_counters', {{}})",
        "        cnt = cache.get(a.device)",
        "        if cnt is None or cnt.numel() < n_cnt:",
        "            cnt = torch.zeros(max(n_cnt, 4096), device=a.device, dtype=torch.int32)",
        "            cache[a.device] = cnt",
    ]
    if spec.persistent:
        L += [
            '    progs = int(cfg.get("NUM_PROGS", 0))',
            "    if progs <= 0:",
            "        if a.is_cuda:",
            "            progs = torch.cuda.get_device_properties(a.device).multi_processor_count",
            "        else:",
            "            progs = 3  # interpreter: a few programs so that each walks several items",
            "    grid = (min(work, progs),)",
        ]
    else:
        L.append("    grid = (work,)")
    consts = ["BLOCK_M=BM", "BLOCK_N=BN", "BLOCK_K=BK", 'GROUP_M=int(cfg["GROUP_M"])', "SPLIT_K=SK",
              "EVEN_K=(K % (BK * SK) == 0)"]
    if r is not None:
        consts.append(f"ONE_N_TILE=({one_tile})")
    if r == "layernorm":
        consts.append('EPS=float(cfg["eps"])')
    if spec.dtype == "bfloat16":
        consts.append("UPCAST_DOT=(not a.is_cuda)")  # CPU tensors only run in the interpreter
    consts += ['num_warps=int(cfg["num_warps"])', 'num_stages=int(cfg["num_stages"])']
    call_args = ["a", "b", "out", "ws", "cnt", *args, "M", "N", "K", "B",
                 "sab", "sam", "sak", "sbb", "sbk", "sbn", "sob", "som", "son", *strides, *consts]
    L.append(f"    {name}_kernel[grid](")
    L += ["        " + x + "," for x in call_args]
    L += ["    )", "    return out", ""]
    return "\n".join(L)


# ------------------------------------------------------------------------------------- public API


def gemm_kernel(spec: GemmSpec) -> KernelSource:
    """Generate the Triton kernel and its launcher for ``spec`` (raises ValueError on a bad spec)."""
    _check(spec)
    config = _default_config(spec)
    return KernelSource(
        name=spec.name,
        kernel_src=_kernel_src(spec),
        launcher_src=_launcher_src(spec, config),
        config=dict(config),
        space=_space(spec),
        kernel_name=f"{spec.name}_kernel",
        launcher_name=f"launch_{spec.name}",
        output="vector" if spec.row_reduction in VECTOR_REDUCTIONS else "matrix",
    )


_HEADER = "import torch\nimport triton\nimport triton.language as tl\n\n\n"
_LOAD_DIR = None
_loaded = 0


def load_kernel(ks: KernelSource) -> Callable[..., Any]:
    """Import the generated text as a module (Triton needs a real file to read the kernel source from)
    and return its launcher. Used by tests and benchmarks; candidate files embed ``ks.source``."""
    global _LOAD_DIR, _loaded
    if _LOAD_DIR is None:
        _LOAD_DIR = tempfile.mkdtemp(prefix="kl_gemm_")
    _loaded += 1
    modname = f"_kl_gemm_{ks.name}_{_loaded}"
    path = Path(_LOAD_DIR) / f"{modname}.py"
    path.write_text(_HEADER + ks.source)
    spec = importlib.util.spec_from_file_location(modname, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[modname] = mod
    spec.loader.exec_module(mod)
    return getattr(mod, ks.launcher_name)

