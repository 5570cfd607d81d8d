"""Counted bytes and FLOPs per fusion group, and roofline times against the measured ceilings.

Ceilings (measured on the reference H200, torch 2.11; kernellab.report.CEILINGS): copy 4.22 TB/s read+write; cuBLAS fp32 51 TFLOP/s, tf32 355,
bf16/fp16 ~700. Bytes are what a group must move at least (its inputs once, its outputs once);
FLOPs are 2MNK per GEMM (a conv group: 2 x outputs x Cin/groups x taps) plus one per element per
pointwise/reduction op. Uncaptured ops count their bytes only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .ir import Graph, Ref
from .kernels.loop_launcher import SPLIT_MAX_ROWS, SPLIT_MIN_CHUNK
from .partition import Group

__all__ = ["GroupCost", "group_costs", "CEILING_BW", "peak_flops", "ITEMSIZE", "Modelled",
           "model_built", "eager_profile", "modelled_seconds", "LAUNCH_S", "floor_seconds"]

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


# ops that may read only part of an input (an index, a slice, a gather) or only its shape (``zeros_like``):
# where one is an input's only reader, that input's bytes are not compulsory, so a graph with one gets no floor
_PART_READERS = frozenset({
    "gather", "index", "index_select", "index_put", "embedding", "embedding_bag", "take", "take_along_dim",
    "masked_select", "nonzero", "scatter", "scatter_add", "slice", "select", "narrow", "as_strided", "diagonal",
    "unfold", "split", "split_with_sizes", "chunk", "unbind", "tensor_split", "zeros_like", "ones_like",
    "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "new_zeros", "new_ones", "new_empty",
    "new_full", "sym_size", "size", "topk", "kthvalue", "sort", "searchsorted", "bucketize",
})


def floor_seconds(graph: Graph) -> float | None:
    """A floor under the time of any implementation of the whole graph on the H200: every input and
    parameter it uses read once and every output written once at the measured copy bandwidth, or its
    FLOPs at the fastest measured rate of its dtype (TF32's for float32: cuDNN's default convolutions
    and our tf32 kernels run there), whichever is longer. Unlike a candidate's counted bytes it does
    not move with the candidate's fusion, so a candidate near it has little left to gain (the
    campaign's roofline stop). A read-mostly kernel can beat the copy bandwidth a little (100_HingeLoss:
    107%), so this is the practical roofline, not a bound. An op left to PyTorch counts as reading
    its inputs whole (argmax, pooling, a norm); None where an op may read part of one (a gather, a
    slice, ``zeros_like``: ``_PART_READERS``, or a view that selects), since a floor set too high
    would stop a campaign that could still gain."""
    compute: list[str] = []
    for n in graph.nodes:
        if n.kind in ("opaque", "special") and n.op.split(".")[0] in _PART_READERS:
            return None
        if n.kind == "view":
            src = graph.node(n.args[0].name) if n.args and isinstance(n.args[0], Ref) else None
            if src is None or n.shape is None or src.shape is None or math.prod(n.shape) < math.prod(src.shape):
                return None
        elif n.kind not in ("input", "param"):
            compute.append(n.name)
    read = [n.name for n in graph.nodes if n.kind in ("input", "param") and graph.users[n.name]]
    written = [o for o in graph.output_names() if graph.view_base(o).kind not in ("input", "param")]
    if not compute or not written:
        return None
    kind = "gemm" if any(graph.node(n).kind in ("gemm", "conv") for n in compute) else "pointwise"
    whole = Group(id="floor", kind=kind, nodes=compute, inputs=read, outputs=sorted(written))
    return group_costs(graph, [whole], tf32=True)[0].seconds


# -- a modelled H200 time (for ranking where nothing is timed on a GPU) -----------------------------
# The roofline above is a lower bound that ignores the configuration; the search on a CPU (Triton
# interpreter: correctness is real, times are not) needs an order in which a tile size, a warp count
# or a split changes the answer. ``model_built`` (and the builtin's ``modelled_ms``) adds to the roofline what a configuration costs on
# the H200: a launch per kernel, filling the 132 SMs (wave quantization), bytes in flight (Little's
# law), vector width per thread, GEMM operand re-reads across tiles, pipeline depth. It only ranks
# candidates on the CPU: it is never printed as a speedup.
LAUNCH_S = 4e-6  # one kernel launch as the host sees it (PyTorch eager pays about as much per op)
SMS = 132
_IN_FLIGHT = 2.5e6  # bytes in flight to reach the copy ceiling: 4.22 TB/s x ~600 ns DRAM latency
_WARPS_PER_SM = 64
_STAGES = {1: 0.6, 2: 0.8, 3: 0.92, 4: 0.95, 5: 0.95}


@dataclass(frozen=True)
class Modelled:
    ms: float  # the candidate's modelled time
    eager_ms: float  # the reference's, one PyTorch op (one launch) per captured op
    groups: dict  # group id -> modelled ms

    @property
    def ratio(self) -> float:
        """Modelled eager / modelled candidate: a search score on the CPU, never a reported speedup."""
        return self.eager_ms / self.ms if self.ms > 0 else 0.0


def _fill(programs: int, per_sm: int) -> float:
    """The share of SM slots busy over the waves a grid of ``programs`` takes."""
    slots = SMS * max(1, per_sm)
    waves = max(1, math.ceil(programs / slots))
    return max(programs, 1) / (waves * slots) if programs < slots * 4 else 1.0


def _memory_eff(programs: int, per_program_bytes: float, warps: int) -> float:
    per_sm = max(1, _WARPS_PER_SM // max(1, warps))
    resident = min(programs, SMS * per_sm)
    in_flight = min(1.0, resident * per_program_bytes / _IN_FLIGHT)
    return max(0.05, in_flight * _fill(programs, per_sm))


def _vector_eff(elems_per_thread: float) -> float:
    if elems_per_thread < 1:
        return 0.5  # idle lanes
    if elems_per_thread < 4:
        return 0.7 + 0.1 * elems_per_thread  # narrower than 16-byte loads
    return 1.0 if elems_per_thread <= 16 else max(0.7, 1.0 - 0.05 * math.log2(elems_per_thread / 16))


def _pointwise_s(c: GroupCost, grp: Group, cfg: dict, itemsize: int) -> float:
    n = math.prod(grp.domain or (1,))
    block, warps = int(cfg.get("BLOCK", 1024)), int(cfg.get("num_warps", 4)) or 4
    programs = math.ceil(n / block)
    eff = _memory_eff(programs, block * itemsize * 2, warps) * _vector_eff(block / (32 * warps))
    return LAUNCH_S + c.bytes / (CEILING_BW * eff)


def _rows_s(c: GroupCost, grp: Group, cfg: dict, itemsize: int) -> float:
    r = max(1, int(c.dims.get("R", 1)))
    rows = max(1, int(c.dims.get("rows", 1)))
    sp = max(1, int(cfg.get("SPLIT_R", 1) or 1))  # a split reduction, as its launcher cuts the rows
    while sp > 1 and (r % sp or r // sp < SPLIT_MIN_CHUNK):
        sp //= 2
    if sp > 1 and rows < int(cfg.get("SPLIT_MAX_ROWS", SPLIT_MAX_ROWS)):
        rows, r = rows * sp, r // sp
    block_r = 1 << (r - 1).bit_length()
    mode = str(cfg.get("mode", "auto"))
    one = mode == "one_pass" or (mode == "auto" and block_r <= int(cfg.get("MAX_R", 8192)))
    if not one:
        block_r = min(block_r, int(cfg.get("BLOCK_R", 2048)))
    block_rows = max(1, min(int(cfg.get("TILE", 4096)) // block_r, 1 << (rows - 1).bit_length(), 1 << 30 if one else 16))
    warps = int(cfg.get("num_warps", 0)) or max(1, min(16, block_rows * block_r // 256))
    programs = math.ceil(rows / block_rows)
    per_thread = block_rows * block_r / (32 * warps)
    eff = _memory_eff(programs, block_rows * block_r * itemsize, warps) * _vector_eff(per_thread)
    if one and per_thread > 64:  # the tile does not fit the registers: spills to local memory
        eff *= 64 / per_thread
    passes = 1.0 if one else 1.6  # the second read mostly from L2
    return LAUNCH_S + c.bytes * passes / (CEILING_BW * eff)


def _gemm_s(c: GroupCost, cfg: dict, peak: float, itemsize: int) -> float:
    m, n, k, b = (int(c.dims.get(x, 1)) for x in ("M", "N", "K", "B"))
    bm, bn, bk = int(cfg.get("BLOCK_M", 128)), int(cfg.get("BLOCK_N", 128)), int(cfg.get("BLOCK_K", 32))
    split = max(1, int(cfg.get("SPLIT_K", 1) or 1))
    tiles = math.ceil(m / bm) * math.ceil(n / bn) * b * split
    fill = 1.0 if "NUM_PROGS" in cfg and tiles > SMS else _fill(tiles, 1)
    tile_eff = min(1.0, (bm * bn / (128 * 128)) ** 0.3) * (0.85 if bk < 32 else 1.0)
    if bm * bn * 4 / (32 * int(cfg.get("num_warps", 8) or 8)) > 256:  # accumulator beyond the registers
        tile_eff *= 0.6
    eff = tile_eff * _STAGES.get(int(cfg.get("num_stages", 3)), 0.9) * (0.97 if "NUM_PROGS" in cfg else 1.0)
    compute = c.flops / (peak * eff * fill)
    reuse = 4.0 if int(cfg.get("GROUP_M", 1)) > 1 else 1.5  # L2 hits when neighbouring tiles share operands
    reads = (m * k * math.ceil(n / bn) + k * n * math.ceil(m / bm)) * b * itemsize / reuse
    traffic = max(c.bytes, reads + c.bytes / 2) + (2 * m * n * b * 4 * split if split > 1 else 0)
    return LAUNCH_S * (2 if split > 1 else 1) + max(compute, traffic / CEILING_BW)


def _op_s(graph: Graph, name: str, tf32: bool) -> float:
    """One captured op run alone, as PyTorch eager runs it: a launch and its own round trip to memory."""
    n = graph.node(name)
    if n.kind in ("input", "param", "view", "getitem") or n.shape is None:
        return 0.0
    nbytes = _nbytes(graph, name) + sum(_nbytes(graph, r) for r in n.refs() if graph.node(r).shape is not None)
    flops = 0.0
    if n.kind == "gemm":
        a, b = graph.node(n.args[0].name), graph.node(n.args[1].name)
        nn = b.shape[-2] if n.op == "linear" else b.shape[-1]
        flops = 2.0 * math.prod(a.shape[:-1]) * nn * a.shape[-1]
        return LAUNCH_S + max(nbytes / CEILING_BW, flops / (0.8 * peak_flops(a.dtype or "float32", tf32)))
    return LAUNCH_S + nbytes / CEILING_BW


def eager_profile(graph: Graph, tf32: bool = False) -> dict:
    """The reference as the cost model sees it: one PyTorch op per captured op, in the format of
    ``Agents.plan``'s ``reference`` (``{"ops": [{"name", "ms", "share"}], "eager_ms"}``) plus
    ``modelled: True``. Ops are named ``aten::<op>``, by the high-level op they came from when lowered
    (``softmax``), so that ``plan`` can map them onto fusion groups."""
    times: dict[str, float] = {}
    for n in graph.nodes:
        s = _op_s(graph, n.name, tf32)
        if s > 0:
            key = f"aten::{(n.origin.split(':')[0] or n.op).split('.')[0]}"
            times[key] = times.get(key, 0.0) + s
    total = sum(times.values()) or 1.0
    ops = [{"name": k, "ms": round(v * 1e3, 6), "share": round(v / total, 4)}
           for k, v in sorted(times.items(), key=lambda kv: -kv[1])]
    return {"ops": ops, "eager_ms": round(total * 1e3, 6), "modelled": True, "device": "H200 (modelled)"}


def model_built(b, settings: dict, config: dict | None = None) -> Modelled:
    """The modelled time of an already built candidate (``kernellab.agents.builtin.build.Built``: graph, groups,
    state): ``config`` is its nested
    ``CONFIG`` (group id -> values), e.g. the candidate's own overlaid with a tuning trial's."""
    from .codegen import allow_tf32, default_precision

    tf32 = allow_tf32(settings["dtype"], settings["atol"], settings["rtol"])
    itemsize = ITEMSIZE.get(settings["dtype"], 4)
    per: dict[str, float] = {}
    for c in group_costs(b.graph, b.groups, tf32=tf32):
        grp = next(g for g in b.groups if g.id == c.group)
        variant = b.state.variant(grp.id)
        cfg = {**(variant.get("config") or {}), **((config or {}).get(grp.id) or {})}
        if grp.kind == "pointwise":
            secs = _pointwise_s(c, grp, cfg, itemsize)
        elif grp.kind == "rows":
            secs = _rows_s(c, grp, {"mode": variant.get("mode", "auto"), **cfg}, itemsize)
        elif grp.kind == "gemm":
            prec = variant.get("fp32_precision") or default_precision(b.graph, grp, settings)
            peak = {"tf32": peak_flops("float32", True), "tf32x3": peak_flops("float32", True) / 3}.get(
                prec or "", peak_flops(settings["dtype"]))
            secs = _gemm_s(c, cfg, peak, itemsize)
        elif grp.kind == "torch":
            secs = sum(_op_s(b.graph, n, tf32) for n in grp.nodes)
        else:
            secs = LAUNCH_S + c.seconds
        per[grp.id] = secs * 1e3
    eager = eager_profile(b.graph, tf32)["eager_ms"]
    return Modelled(ms=sum(per.values()), eager_ms=eager, groups=per)


# -- the modelled time of a whole candidate (what the planner's expected gains come from) ----------

# (LAUNCH_S and SMS: as for model_built above)
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
    GEMM or fp32 conv group's dot precision (None for half types). Used to rank actions, never reported as
    a time."""
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
        elif grp.kind == "conv" and precision.get(grp.id):
            # an fp32 conv's dot at its precision's ceiling (tf32rn: a TF32 dot, the rounding is a few
            # integer ops per loaded operand)
            prec = "tf32" if precision[grp.id] == "tf32rn" else precision[grp.id]
            peak = _DOT_PEAK[prec] * (TRITON_IEEE_EFF if prec == "ieee" else 1.0)
            secs = max(c.bytes / CEILING_BW, c.flops / peak)
        else:
            secs = c.seconds
        out[grp.id] = secs + LAUNCH_S
    return out
