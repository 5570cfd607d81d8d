"""Counted bytes and FLOPs per fusion group, and roofline times against the measured ceilings.

Ceilings (measured on the reference H200, torch 2.11; kernellab.report.CEILINGS): copy 4.22 TB/s read+write; cuBLAS fp32 51 TFLOP/s, tf32 355,
bf16/fp16 ~700. Bytes are what a group must move at least (its inputs once, its outputs once);
FLOPs are 2MNK per GEMM (a conv group: 2 x outputs x Cin/groups x taps) plus one per element per
pointwise/reduction op. Uncaptured ops count their bytes only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ir import Graph
from .partition import Group

__all__ = ["GroupCost", "group_costs", "CEILING_BW", "peak_flops", "ITEMSIZE"]

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
            elif n.kind == "conv" and n.shape is not None:
                w = graph.node(n.args[1].name).shape
                taps = math.prod(w[2:])
                k = (w[0] // n.attrs["groups"] if n.attrs["transposed"] else w[1]) * taps
                # transposed: every output pixel visits all taps, (1 - 1/stride) of them masked
                flops += 2.0 * math.prod(n.shape) * k
                dims = {"M": math.prod(n.shape) // n.shape[1], "N": n.shape[1], "K": k, "B": 1}
                dtype = graph.node(n.args[0].name).dtype or dtype
            elif n.kind in ("pw", "reduce") and n.shape is not None:
                src = graph.node(n.args[0].name) if n.kind == "reduce" else n
                flops += float(math.prod(src.shape or (1,)))
        if grp.kind == "rows":
            dims = {"R": math.prod(grp.domain[d] for d in grp.red_dims),
                    "rows": math.prod(grp.domain) // max(1, math.prod(grp.domain[d] for d in grp.red_dims))}
        peak = peak_flops(dtype, tf32) if grp.kind in ("gemm", "conv") or any(
            graph.node(n).kind == "gemm" for n in grp.nodes) else _PEAK["float32"]
        secs = max(nbytes / CEILING_BW, flops / peak)
        out.append(GroupCost(grp.id, grp.kind, nbytes, flops, secs, dims))
    return out
