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

from . import gemm_template as T
from .gemm_launcher import launcher_src
from .template import indent, render, stmts

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


def _helper(fn: str, params: list[str], body: str) -> list[str]:
    return ["@triton.jit", f"def {fn}({', '.join(params)}):", *indent(stmts(body), 1), "    return acc", ""]


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
    """The kernel: ``gemm_template.KERNEL`` with its holes filled for ``spec``."""
    name = spec.name
    r = spec.row_reduction
    vector = r in VECTOR_REDUCTIONS
    two_stats = r in ("softmax", "log_softmax", "logsumexp", "layernorm")
    epi_fn, repi_fn, kname = f"_{name}_epilogue", f"_{name}_row_epilogue", f"{name}_kernel"
    has_epi, has_repi = bool(stmts(spec.epilogue)), bool(stmts(spec.row_epilogue))

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

    epi = [_call(epi_fn, "acc", _op_args(spec))] if has_epi else []
    loads = _load_ops(spec, "offs_n", "mask_n")
    if r is None:
        finish = render(T.FINISH_TILE, LOAD_OPERANDS=loads, EPILOGUE=epi)
    else:
        if vector:
            repi_one = [_call(repi_fn, "vec", _op_args(spec, vector=True))] if has_repi else []
            one = [*_reduce_one_tile(spec), *repi_one, T.STORE_VECTOR]
            vec_of = {"logsumexp": "lse", "sum": "r0", "max": "r0"}[r]
            write_rows = render(T.WRITE_VECTOR, VEC=vec_of, ROW_EPILOGUE=repi_one)
        else:
            repi_one = [_call(repi_fn, "acc", _op_args(spec))] if has_repi else []
            one = [*_reduce_one_tile(spec), *repi_one, T.STORE_TILE]
            write_rows = render(
                T.NORMALIZE_ROWS,
                LOAD_OPERANDS=_load_ops(spec, "offs_nj", "mask_nj", "_j") if (has_repi or r == "layernorm") else [],
                NORMALIZE=[re.sub(r"\bacc\b", "y", ln) for ln in _normalize(spec)],
                ROW_EPILOGUE=[_call(repi_fn, "y", _op_args(spec, "_j"))] if has_repi else [])
        finish = render(
            T.FINISH_ROWS, LOAD_OPERANDS=loads, EPILOGUE=epi, ONE_TILE=one, TILE_STATS=_tile_stats(r),
            STORE_RAW=[] if vector else [T.STORE_TILE],  # the raw row values, normalised by the last tile
            STORE_ST1=["tl.store(row_ws + ws_plane + pid_n, st1, mask=mask_m)"] if two_stats else [],
            INIT0='float("-inf")' if r == "max" else "0.0",  # masked rows only: keeps them finite
            LOAD_R1=['r1 = tl.load(row_ws + ws_plane, mask=mask_m, other=1.0, cache_modifier=".cg")'] if two_stats else [],
            LOAD_C1=['c1 = tl.load(row_ws + ws_plane + j, mask=mask_m, other=1.0, cache_modifier=".cg")'] if two_stats else [],
            COMBINE=_combine(r), FINALIZE=_finalize(r), WRITE_ROWS=write_rows)

    work_item = render(T.WORK_ITEM, DOT=dot, FINISH=finish)
    program = render(T.PERSISTENT if spec.persistent else T.ONE_PROGRAM, WORK_ITEM=work_item)
    return "\n".join(render(T.KERNEL, HELPERS=helpers, KERNEL=kname, PARAMS=[p + "," for p in params],
                             PROGRAM=program)) + "\n"


# ------------------------------------------------------------------------------------- public API


def gemm_kernel(spec: GemmSpec) -> KernelSource:
    """Generate the Triton kernel and its launcher for ``spec`` (raises ValueError on a bad spec)."""
    _check(spec)
    config = _default_config(spec)
    return KernelSource(
        name=spec.name,
        kernel_src=_kernel_src(spec),
        launcher_src=launcher_src(spec, config, spec.row_reduction in VECTOR_REDUCTIONS),
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

