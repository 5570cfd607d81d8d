"""Counted bytes and FLOPs per fusion group, and roofline times against the measured ceilings.

Ceilings (measured on the reference H200, torch 2.11; kernellab.report.CEILINGS): copy 4.22 TB/s read+write; cuBLAS fp32 51 TFLOP/s, tf32 355,
bf16/fp16 ~700. Bytes are what a group must move at least (its inputs once, its outputs once);
FLOPs are 2MNK per GEMM plus one per element per pointwise/reduction op. Convolutions and other
uncaptured ops count their bytes only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ir import Graph
from .partition import Group

__all__ = ["GroupCost", "group_costs", "CEILING_BW", "peak_flops", "ITEMSIZE", "modelled_seconds", "LAUNCH_S"]

CEILING_BW = 4.22e12  # bytes/s, read+write
_PEAK = {"float32": 51e12, "tf32": 355e12, "float16": 700e12, "bfloat16": 700e12}
ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "bool": 1, "int64": 8, "int32": 4, "int8": 1,
            "uint8": 1, "float64": 8}


def peak_flops(dtype: str, tf32: bool = False) -> float:
    return _PEAK["tf32"] if (dtype == "float32" and tf32) else _PEAK.get(dtype, _PEAK["float32"])


@dataclass
class GroupCost:
    group: str
    kind: str
    bytes: float
    flops: float
    seconds: float  # roofline lower bound
    dims: dict


def _nbytes(graph: Graph, name: str) -> float:
    n = graph.node(name)
    if n.shape is None:
        return 0.0
    return float(math.prod(n.shape)) * ITEMSIZE.get(n.dtype or "float32", 4)


def group_costs(graph: Graph, groups: list[Group], tf32: bool = False) -> list[GroupCost]:
    out = []
    for grp in groups:
        if grp.kind == "torch" and all(graph.node(n).kind in ("view", "getitem") for n in grp.nodes):
            continue  # metadata only
        nbytes = sum(_nbytes(graph, v) for v in grp.inputs) + sum(_nbytes(graph, v) for v in grp.outputs)
        if grp.kind == "special" and graph.node(grp.nodes[0]).op == "embedding":
            # a gather reads the rows it copies, not the whole table
            n0 = graph.node(grp.nodes[0])
            nbytes = 2 * _nbytes(graph, n0.name) + _nbytes(graph, n0.args[1].name)
        flops, dims = 0.0, {}
        dtype = "float32"
        for name in grp.nodes:
            n = graph.node(name)
            if n.kind == "gemm":
                a, b = graph.node(n.args[0].name), graph.node(n.args[1].name)
                k = a.shape[-1]
                m = math.prod(a.shape[:-1])
                nn = b.shape[-2] if n.op == "linear" else b.shape[-1]
                flops += 2.0 * m * nn * k
                dims = {"M": a.shape[-2] if n.op == "bmm" else m, "N": nn, "K": k,
                        "B": a.shape[0] if n.op == "bmm" else 1}
                dtype = a.dtype or dtype
            elif n.kind in ("pw", "reduce") and n.shape is not None:
                src = graph.node(n.args[0].name) if n.kind == "reduce" else n
                flops += float(math.prod(src.shape or (1,)))
        if grp.kind == "rows":
            dims = {"R": math.prod(grp.domain[d] for d in grp.red_dims),
                    "rows": math.prod(grp.domain) // max(1, math.prod(grp.domain[d] for d in grp.red_dims))}
        peak = peak_flops(dtype, tf32) if grp.kind == "gemm" or any(
            graph.node(n).kind == "gemm" for n in grp.nodes) else _PEAK["float32"]
        secs = max(nbytes / CEILING_BW, flops / peak)
        out.append(GroupCost(grp.id, grp.kind, nbytes, flops, secs, dims))
    return out


# -- the modelled time of a whole candidate (what the planner's expected gains come from) ----------

LAUNCH_S = 3e-6  # one kernel launch and its tail: what a fusion saves beyond the bytes
SMS = 132  # H200 streaming multiprocessors
# fraction of the fp32 ceiling an IEEE-dot Triton GEMM reaches on the FMA units (cuBLAS reaches it all)
TRITON_IEEE_EFF = 0.7
_DOT_PEAK = {"ieee": _PEAK["float32"], "tf32": _PEAK["tf32"], "tf32x3": _PEAK["tf32"] / 3}


def _gemm_seconds(c: GroupCost, variant: dict, precision: str | None, dtype: str) -> float:
    """A Triton GEMM group: roofline at its dot's ceiling, scaled by how full its last wave of tiles
    is (split-K multiplies the tiles and adds a workspace round trip) and a small persistent bonus."""
    m, n, b = c.dims.get("M", 1), c.dims.get("N", 1), c.dims.get("B", 1)
    cfg = variant.get("config") or {}
    bm, bn = int(cfg.get("BLOCK_M", 128)), int(cfg.get("BLOCK_N", 128))
    split = int(variant.get("split_k", 1) or 1)
    tiles = math.ceil(m / bm) * math.ceil(n / bn) * b * split
    waves = math.ceil(tiles / SMS)
    fill = tiles / (waves * SMS)
    if precision is None:  # half types: native tensor-core dot
        peak = _PEAK.get(dtype, _PEAK["float32"])
    else:
        peak = _DOT_PEAK[precision] * (TRITON_IEEE_EFF if precision == "ieee" else 1.0)
    extra = 2.0 * split * m * n * b * 4 if split > 1 else 0.0  # fp32 partials written and read back
    secs = max((c.bytes + extra) / CEILING_BW, c.flops / peak / fill)
    if variant.get("persistent") and waves > 2:
        secs /= 1.03  # no tail of one-tile programs; the tile order is kept across waves
    if int(cfg.get("GROUP_M", 8)) > 8 and math.ceil(n / bn) > 8:
        secs /= 1.01  # taller super-rows: more reuse of the B panel in L2
    return secs


def _rows_seconds(c: GroupCost, variant: dict, in_bytes: float) -> float:
    """A rows group: its bytes, plus a second read of the inputs when the row does not stay in
    registers (multi-pass, mostly from L2: counted as half), and a register-pressure penalty for
    one-pass rows beyond the auto limit."""
    r = c.dims.get("R", 1)
    cfg = variant.get("config") or {}
    mode = variant.get("mode", "auto")
    max_r = int(cfg.get("MAX_R", 32768 if mode == "one_pass" else 8192))
    one = mode == "one_pass" and r <= max_r or mode == "auto" and r <= max_r
    nbytes = c.bytes if one else c.bytes + 0.5 * in_bytes
    secs = max(nbytes / CEILING_BW, c.flops / _PEAK["float32"])
    if one and r > 8192:
        secs /= 0.85
    # a program per row (per chunk of a row in a split reduction): fewer programs than SMs idle the rest
    progs = c.dims.get("rows", 1) * int(variant.get("split_r", 1) or 1)
    return secs / min(1.0, progs / SMS)


def _pointwise_seconds(c: GroupCost, variant: dict, numel: int) -> float:
    cfg = variant.get("config") or {}
    block = int(cfg.get("BLOCK", 4096 if numel >= (1 << 21) else 1024))
    # wide blocks vectorise loads on big domains; on small ones they leave SMs idle
    fits = (block >= 4096) if numel >= (1 << 21) else (block <= 1024)
    secs = max(c.bytes / CEILING_BW, c.flops / _PEAK["float32"]) / (1.0 if fits else 0.95)
    if variant.get("persistent"):  # fewer launches of programs on big domains; a loop's overhead on small
        secs /= 1.02 if numel >= (1 << 21) else 0.98
    return secs


def modelled_seconds(graph: Graph, groups: list[Group], variants: dict[str, dict],
                     precision: dict[str, str | None]) -> dict[str, float]:
    """Modelled seconds per group of one candidate (a group PyTorch runs counts at its roofline, a
    cuBLAS fp32 GEMM at the full fp32 ceiling), each kernel plus ``LAUNCH_S``. ``precision`` gives a
    GEMM group's dot precision (None for half types). Used to rank actions, never reported as a time."""
    out: dict[str, float] = {}
    for c in group_costs(graph, groups):
        grp = next(g for g in groups if g.id == c.group)
        variant = variants.get(grp.id, {})
        if grp.kind == "gemm":
            dtype = graph.node(graph.node(grp.gemm).args[0].name).dtype or "float32"
            secs = _gemm_seconds(c, variant, precision.get(grp.id), dtype)
        elif grp.kind == "rows":
            secs = _rows_seconds(c, variant, sum(_nbytes(graph, v) for v in grp.inputs))
        elif grp.kind == "pointwise":
            secs = _pointwise_seconds(c, variant, math.prod(grp.domain or (1,)))
        else:
            secs = c.seconds
        out[grp.id] = secs + LAUNCH_S
    return out
