"""Templates for ops that are neither pointwise, row reductions nor GEMMs: one ``special`` node each
(see ``lower.py``), one kernel per group.

- ``cumsum``, ``cumprod`` a scan along one dim: rows of the scanned dim in chunks of ``BLOCK_R``; ``tl.cumsum``
                 (``tl.cumprod``) inside a chunk, a per-row carry between chunks (fp64 whatever the storage type).
- ``embedding``  a gather of table rows: a [BLOCK_T tokens, BLOCK_H columns] tile per program, loads
                 and stores contiguous along the hidden dim (a pure copy: exact in any dtype).
- ``pool``       a window max or average over 2 or 3 spatial dims (1-D pools arrive as 2-D): one program per
                 BLOCK outputs, contiguous along the output width; the taps of neighbouring windows overlap,
                 so re-reads come from L1/L2, not DRAM. The average sums the taps in PyTorch's order and
                 divides as PyTorch does (``count_include_pad``, ``divisor_override``).
- ``arg_extreme`` argmax / argmin over one dim (or the flattened tensor): columns contiguous along the dims
                 after it, the reduced dim walked in chunks; PyTorch's first index of the extreme, NaN first.
All five are memory-bound: the tiles are chosen for full 128-byte transactions on the contiguous
dim and a few KB in flight per program; the launchers read every size at run time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..ir import Graph, Node
from ..partition import Group

__all__ = ["special_kernel", "SpecialSource", "SPECIAL_OPS", "torch_expr"]

SPECIAL_OPS = ("cumsum", "cumprod", "embedding", "pool", "arg_extreme")


@dataclass
class SpecialSource:
    source: str  # kernel + launcher
    call: str  # the forward line(s)
    config: dict
    space: dict


def torch_expr(n: Node, args: list[str]) -> str:
    """The PyTorch call a special node stands for (a group sent back to PyTorch by an action)."""
    if n.op in ("cumsum", "cumprod"):
        return f"torch.{n.op}({args[0]}, dim={n.attrs['dim']}).to(torch.{n.dtype})"
    if n.op == "embedding":
        return f"torch.nn.functional.embedding({args[1]}, {args[0]})"
    if n.op == "arg_extreme":
        return f"torch.arg{n.attrs['mode']}({args[0]}, dim={n.attrs['dim']}, keepdim={n.attrs['keepdim']})"
    if n.op == "pool":
        a, nd = n.attrs, len(n.attrs["kernel"])
        if a["mode"] == "avg":
            return (f"torch.nn.functional.avg_pool{nd}d({args[0]}, {a['kernel']}, {a['stride']}, {a['padding']}, "
                    f"{a['ceil_mode']}, {a['count_include_pad']}, {a['divisor_override']})")
        return (f"torch.nn.functional.max_pool{nd}d({args[0]}, {a['kernel']}, {a['stride']}, {a['padding']}, "
                f"{a['dilation']}, ceil_mode={a['ceil_mode']})")
    raise ValueError(f"no PyTorch rendering for special op {n.op}")


def _scan(name: str, n: Node, x: str, opts: dict) -> SpecialSource:
    mul = n.op == "cumprod"
    # the chunk's total: a sum, or a product by a combine function of the generated file's own
    total = f"tl.reduce(v, 1, _mul_{name})" if mul else "tl.sum(v, axis=1)"
    head = f"@triton.jit\ndef _mul_{name}(a, b):\n    return a * b\n\n\n" if mul else ""
    src = head + f'''@triton.jit
def k_{name}(x_ptr, y_ptr, NROWS, R, BLOCK_ROWS: tl.constexpr, BLOCK_R: tl.constexpr, BIG: tl.constexpr):
    pid = tl.program_id(0)
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    if BIG:
        rows = rows.to(tl.int64)
    rmask = rows < NROWS
    # fp64 sums: a scan in another order than torch's differs from it by up to ~15 fp32 ulps of the
    # running sum at 8192 columns (1e-4 near zero crossings); in fp64 ours is exact to one rounding,
    # and the memory-bound kernel does not notice the wider arithmetic
    carry = tl.full([BLOCK_ROWS], {1.0 if mul else 0.0}, tl.float64)
    # the carry enters the chunk's first column before the scan, so the scan's result only feeds the
    # store: Triton 3.6 fails to compile a scan result combined with a broadcast on the GPU
    # (OptimizeThreadLocality; experiments/probes/cumsum_variants.py)
    first = (tl.arange(0, BLOCK_R) == 0)[None, :]
    for start in range(0, R, BLOCK_R):
        cols = start + tl.arange(0, BLOCK_R)
        mask = rmask[:, None] & (cols < R)[None, :]
        offs = rows[:, None] * R + cols[None, :]
        v = tl.load(x_ptr + offs, mask=mask, other={1.0 if mul else 0.0}).to(tl.float64)
        v = tl.where(first, v {"*" if mul else "+"} carry[:, None], v)
        tl.store(y_ptr + offs, tl.{n.op}(v, axis=1).to(tl.float32).to(y_ptr.dtype.element_ty), mask=mask)
        carry = {total}


def launch_{name}(x):
    """Inclusive prefix {"product" if mul else "sum"} of ``x`` along dim {n.attrs["dim"]} (the scanned dim made innermost)."""
    cfg = CONFIG[{name!r}]
    xt = x.movedim({n.attrs["dim"]}, -1).contiguous()
    out = torch.empty(xt.shape, device=x.device, dtype=torch.{n.dtype})
    r = xt.shape[-1] if xt.dim() else 1
    nrows = xt.numel() // max(r, 1)
    if xt.numel() == 0:
        return out.movedim(-1, {n.attrs["dim"]})
    block_r = min(triton.next_power_of_2(r), int(cfg["BLOCK_R"]))
    block_rows = max(1, min(int(cfg["TILE"]) // block_r, triton.next_power_of_2(nrows)))
    warps = int(cfg["num_warps"]) or max(1, min(8, block_rows * block_r // 512))
    k_{name}[(triton.cdiv(nrows, block_rows),)](xt, out, nrows, r, BLOCK_ROWS=block_rows, BLOCK_R=block_r,
        BIG=xt.numel() >= 2**31, num_warps=warps)
    return out.movedim(-1, {n.attrs["dim"]})
'''
    # 4096 fp32 = 16 KB per chunk: wide enough for full transactions, short enough to stay in registers
    config = {"BLOCK_R": int(opts.get("BLOCK_R", 4096)), "TILE": int(opts.get("TILE", 4096)),
              "num_warps": int(opts.get("num_warps", 0))}
    space = {"BLOCK_R": [1024, 2048, 4096, 8192], "TILE": [2048, 4096, 8192], "num_warps": [0, 4, 8, 16]}
    return SpecialSource(src, f"{n.name} = launch_{name}({x})", config, space)


def _embedding(name: str, n: Node, w: str, ids: str, opts: dict) -> SpecialSource:
    src = f'''@triton.jit
def k_{name}(w_ptr, ids_ptr, out_ptr, T, H, SW0, SW1, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr):
    pid_t = tl.program_id(0)
    pid_h = tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    ids = tl.load(ids_ptr + t, mask=tmask, other=0).to(tl.int64)
    h = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    mask = tmask[:, None] & (h < H)[None, :]
    vals = tl.load(w_ptr + ids[:, None] * SW0 + h[None, :] * SW1, mask=mask, other=0.0)
    tl.store(out_ptr + t.to(tl.int64)[:, None] * H + h[None, :], vals, mask=mask)


def launch_{name}(w, ids):
    """Rows ``w[ids]`` (an embedding lookup; ids must lie in [0, w.shape[0]) as PyTorch requires)."""
    cfg = CONFIG[{name!r}]
    flat = ids.reshape(-1).contiguous()
    hdim = w.shape[1]
    out = torch.empty((flat.numel(), hdim), device=w.device, dtype=w.dtype)
    if out.numel() == 0:
        return out.view(*ids.shape, hdim)
    block_h = min(triton.next_power_of_2(hdim), int(cfg["BLOCK_H"]))
    block_t = max(1, min(int(cfg["TILE"]) // block_h, triton.next_power_of_2(flat.numel())))
    grid = (triton.cdiv(flat.numel(), block_t), triton.cdiv(hdim, block_h))
    k_{name}[grid](w, flat, out, flat.numel(), hdim, w.stride(0), w.stride(1), BLOCK_T=block_t, BLOCK_H=block_h,
        num_warps=int(cfg["num_warps"]))
    return out.view(*ids.shape, hdim)
'''
    # 1024 columns x 4 tokens: 4 KB contiguous per row (fp32), 16 elements per thread at 4 warps
    config = {"BLOCK_H": int(opts.get("BLOCK_H", 1024)), "TILE": int(opts.get("TILE", 4096)),
              "num_warps": int(opts.get("num_warps", 4))}
    space = {"BLOCK_H": [256, 512, 1024, 2048], "TILE": [2048, 4096, 8192], "num_warps": [2, 4, 8]}
    return SpecialSource(src, f"{n.name} = launch_{name}({w}, {ids})", config, space)


POOL_DIMS = ("d", "h", "w")


def _pool(name: str, n: Node, x: str, opts: dict) -> SpecialSource:
    a = n.attrs
    nd, avg = len(a["kernel"]), a["mode"] == "avg"
    dims = POOL_DIMS[-nd:]
    D = [d.upper() for d in dims]
    k, st, pd, dl = a["kernel"], a["stride"], a["padding"], a["dilation"]
    decode, rest = [], "idx"
    for d, big in reversed(list(zip(dims, D, strict=True))):
        decode += [f"    o{d} = {rest} % O{big}", f"    r = {rest} // O{big}"]
        rest = "r"
    body, ind, ok = [], "    ", "mask"
    div = []
    for j, (d, big) in enumerate(zip(dims, D, strict=True)):
        body += [f"{ind}for t{d} in tl.static_range({k[j]}):",
                 f"{ind}    i{d} = o{d} * {st[j]} - {pd[j]} + t{d} * {dl[j]}",
                 f"{ind}    ok{d} = {ok} & (i{d} >= 0) & (i{d} < {big})"]
        ind, ok = ind + "    ", f"ok{d}"
        if avg:  # PyTorch's divisor: the window clipped to the padded input, or to the input itself
            div += [f"    s{d} = o{d} * {st[j]} - {pd[j]}", f"    e{d} = tl.minimum(s{d} + {k[j]}, {big} + {pd[j]})",
                    f"    n{d} = tl.minimum(e{d}, {big}) - tl.maximum(s{d}, 0)"]
    offs = " + ".join(["base", *[f"i{d} * S{big}" for d, big in zip(dims, D, strict=True)]])
    if avg:
        body += [f"{ind}acc += tl.load(x_ptr + {offs}, mask={ok}, other=0.0).to(tl.float32)"]
        if a["divisor_override"]:
            div += [f"    acc = acc / {int(a['divisor_override'])}"]
        elif a["count_include_pad"]:
            div += [f"    acc = acc / ({' * '.join(f'(e{d} - s{d})' for d in dims)}).to(tl.float32)"]
        else:
            div += [f"    acc = acc / ({' * '.join(f'n{d}' for d in dims)}).to(tl.float32)"]
    else:
        body += [f"{ind}v = tl.load(x_ptr + {offs}, mask={ok}, other=float(\"-inf\")).to(tl.float32)",
                 f"{ind}acc = tl.where((v > acc) | (v != v), v, acc)  # NaN wins, as in PyTorch"]
    init = "0.0" if avg else 'float("-inf")'
    sizes, outs, strides = ", ".join(D), ", ".join(f"O{x}" for x in D), ", ".join(f"S{x}" for x in D)
    kernel = [
        "@triton.jit",
        f"def k_{name}(x_ptr, y_ptr, TOTAL, C, {sizes}, {outs}, SN, SC, {strides}, BLOCK: tl.constexpr, BIG: tl.constexpr):",
        "    pid = tl.program_id(0)",
        "    idx = pid * BLOCK + tl.arange(0, BLOCK)",
        "    if BIG:",
        "        idx = idx.to(tl.int64)",
        "    mask = idx < TOTAL",
        *decode,
        "    base = (r // C) * SN + (r % C) * SC",
        f"    acc = tl.full([BLOCK], {init}, tl.float32)",
        *body, *div,
        "    tl.store(y_ptr + idx, acc.to(y_ptr.dtype.element_ty), mask=mask)",
    ]
    what = (f"{a['mode']}_pool{nd}d(kernel={k}, stride={st}, padding={pd}, " +
            (f"ceil_mode={a['ceil_mode']}, count_include_pad={a['count_include_pad']}, divisor_override={a['divisor_override']})"
             if avg else f"dilation={dl}, ceil_mode={a['ceil_mode']})"))
    rank = nd + 2
    src = "\n".join(kernel) + f'''


def _{name}_out(size, k, s, p, d):
    span = size + 2 * p - d * (k - 1) - 1
    out = (span + (s - 1 if {a["ceil_mode"]!r} else 0)) // s + 1
    if {a["ceil_mode"]!r} and (out - 1) * s >= size + p:
        out -= 1  # the last window must start inside the input or its left padding
    return out


def launch_{name}(x):
    """{what}."""
    cfg = CONFIG[{name!r}]
    xb = x if x.dim() == {rank} else x.unsqueeze(0)
    nb, c, *size = xb.shape
    osize = [_{name}_out(size[i], *a) for i, a in enumerate({list(zip(k, st, pd, dl, strict=True))})]
    out = torch.empty((nb, c, *osize), device=x.device, dtype=x.dtype)
    total = out.numel()
    if total:
        block = int(cfg["BLOCK"])
        k_{name}[(triton.cdiv(total, block),)](xb, out, total, c, *size, *osize, *xb.stride(), BLOCK=block,
            BIG=max(total, xb.numel()) >= 2**31, num_warps=int(cfg["num_warps"]))
    return out if x.dim() == {rank} else out.squeeze(0)
'''
    # 8 outputs a thread at 4 warps up to 9 taps, fewer beyond: the unrolled taps' loads are all in flight, and
    # KernelBench 46's 27 taps at 8 a thread took 255 registers and spilled (ptxas), at 2 a thread 163
    block = 128 * max(1, 8 // -(-math.prod(k) // 9))
    config = {"BLOCK": int(opts.get("BLOCK", block)), "num_warps": int(opts.get("num_warps", 4))}
    space = {"BLOCK": [256, 512, 1024, 2048], "num_warps": [2, 4, 8]}
    return SpecialSource(src, f"{n.name} = launch_{name}({x})", config, space)


def _arg_extreme(name: str, n: Node, x: str, opts: dict) -> SpecialSource:
    a = n.attrs
    sign = "" if a["mode"] == "max" else "-"  # argmin(x) is argmax(-x), ties and NaN alike
    src = f'''@triton.jit
def k_{name}(x_ptr, y_ptr, R, INNER, BLOCK_R: tl.constexpr, BLOCK_I: tl.constexpr, BIG: tl.constexpr):
    # x viewed as [outer, R, INNER] (the reduced dim in the middle): a program takes BLOCK_I columns of one outer
    # index, loads contiguous along INNER, and walks R in chunks; the first index of the extreme wins, as in PyTorch,
    # and a NaN is the extreme (its first index)
    pid_o = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    if BIG:
        cols = cols.to(tl.int64)
        pid_o = pid_o.to(tl.int64)
    cmask = cols < INNER
    base = pid_o * R * INNER
    best = tl.full([BLOCK_I], float("-inf"), tl.float32)
    best_i = tl.zeros([BLOCK_I], dtype=tl.int64)
    nan_i = tl.full([BLOCK_I], -1, tl.int64)
    for start in range(0, R, BLOCK_R):
        rows = start + tl.arange(0, BLOCK_R)
        if BIG:
            rows = rows.to(tl.int64)
        mask = (rows < R)[:, None] & cmask[None, :]
        v = tl.load(x_ptr + base + rows[:, None] * INNER + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        v = tl.where(mask, {sign}v, float("-inf"))
        isnan = (v != v).to(tl.int32)
        first_nan = tl.argmax(isnan, axis=0, tie_break_left=True).to(tl.int64) + start
        nan_i = tl.where((nan_i < 0) & (tl.max(isnan, axis=0) > 0), first_nan, nan_i)
        v = tl.where(v != v, float("-inf"), v)
        m = tl.max(v, axis=0)
        at = tl.argmax(v, axis=0, tie_break_left=True).to(tl.int64) + start
        take = m > best
        best_i = tl.where(take, at, best_i)
        best = tl.where(take, m, best)
    tl.store(y_ptr + pid_o * INNER + cols, tl.where(nan_i >= 0, nan_i, best_i), mask=cmask)


def launch_{name}(x):
    """arg{a["mode"]} of ``x`` over dim {a["dim"]} (None: the flattened tensor), keepdim={a["keepdim"]}."""
    cfg = CONFIG[{name!r}]
    dim = {a["dim"]!r}
    xc = (x.reshape(-1) if dim is None else x).contiguous()
    d = 0 if dim is None else dim % max(xc.dim(), 1)
    r = xc.shape[d] if xc.dim() else 1
    outer = math.prod(xc.shape[:d]) if xc.dim() else 1
    inner = math.prod(xc.shape[d + 1:]) if xc.dim() else 1
    out = torch.empty((outer, inner), device=x.device, dtype=torch.int64)
    if out.numel() and r:
        block_i = min(triton.next_power_of_2(inner), int(cfg["BLOCK_I"]))
        block_r = max(1, min(triton.next_power_of_2(r), int(cfg["TILE"]) // block_i))
        k_{name}[(outer, triton.cdiv(inner, block_i))](xc, out, r, inner, BLOCK_R=block_r, BLOCK_I=block_i,
            BIG=xc.numel() >= 2**31, num_warps=int(cfg["num_warps"]))
    keep = {a["keepdim"]!r}
    if dim is None:
        return out.view((1,) * x.dim() if keep else ())
    return out.view(*x.shape[:d], *((1,) if keep else ()), *x.shape[d + 1:])
'''
    # 64 contiguous columns (256 B of fp32) x 64 rows a chunk; a row reduced whole (INNER 1) takes the chunk in R
    config = {"BLOCK_I": int(opts.get("BLOCK_I", 64)), "TILE": int(opts.get("TILE", 4096)),
              "num_warps": int(opts.get("num_warps", 4))}
    space = {"BLOCK_I": [16, 32, 64, 128], "TILE": [2048, 4096, 8192], "num_warps": [2, 4, 8]}
    return SpecialSource(src, f"{n.name} = launch_{name}({x})", config, space)


def special_kernel(graph: Graph, grp: Group, options: dict | None = None) -> SpecialSource:
    """Kernel, launcher and forward line of a ``special`` group (one node)."""
    opts = options or {}
    n = graph.node(grp.nodes[0])
    args = [a.name for a in n.args]
    if n.op in ("cumsum", "cumprod"):
        return _scan(grp.id, n, args[0], opts)
    if n.op == "embedding":
        return _embedding(grp.id, n, args[0], args[1], opts)
    if n.op == "pool":
        return _pool(grp.id, n, args[0], opts)
    if n.op == "arg_extreme":
        return _arg_extreme(grp.id, n, args[0], opts)
    raise ValueError(f"no template for special op {n.op!r}")
