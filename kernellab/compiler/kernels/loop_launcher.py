"""The launcher of a pointwise or rows group's kernels, as text (``LoopLauncher.launcher``: align the operands to
the group's domain, canonicalise the dims per call, pick the kernel variant and tiles from ``CONFIG``, launch), the
split-reduction branch, and ``RUNTIME_HELPERS``, the launchers' shared run-time code (``_kl_align``, ``_kl_canon``),
emitted once per candidate file. ``loopgen._Gen`` inherits the launcher; the indexing scheme is described in
``loopgen.py``'s module docstring."""

from __future__ import annotations

from ..ir import Ref
from .pointwise import literal

__all__ = ["LoopLauncher", "RUNTIME_HELPERS"]

RUNTIME_HELPERS = '''
def _kl_align(t, lead, insert):
    """View ``t`` with ``lead`` leading size-1 dims, then size-1 dims inserted at ``insert``."""
    if not isinstance(t, torch.Tensor):
        t = torch.tensor(t)
    for _ in range(lead):
        t = t.unsqueeze(0)
    for d in insert:
        t = t.unsqueeze(d)
    return t


def _kl_canon(shape, red, ts, kinds):
    """Collapse the domain ``shape`` into 3 kept + 2 reduced dims with per-tensor strides.
    Returns (sizes[5], strides per tensor [5], FULL flags) or None when it needs more dims."""
    nd = len(shape)
    order = [d for d in range(nd) if d not in red] + list(red)
    nk = nd - len(red)
    st = [[t.stride(d) if t.shape[d] != 1 else 0 for d in order] for t in ts]
    sz = [shape[d] for d in order]

    def runs(lo, hi):
        out = []  # [size, [stride per tensor]]
        for i in range(lo, hi):
            if sz[i] == 1:
                continue
            if out and all(s[i] * sz[i] == o for s, o in zip(st, out[-1][1])):
                out[-1] = [out[-1][0] * sz[i], [s[i] for s in st]]
            else:
                out.append([sz[i], [s[i] for s in st]])
        return out

    kept, reduced = runs(0, nk), runs(nk, nd)
    if len(kept) > 3 or len(reduced) > 2:
        return None
    zero = [0] * len(ts)
    kept = [[1, zero]] * (3 - len(kept)) + kept
    reduced = [[1, zero]] * (2 - len(reduced)) + reduced
    dims = kept + reduced
    sizes = [d[0] for d in dims]
    strides = [[d[1][k] for d in dims] for k in range(len(ts))]
    rows, r = sizes[0] * sizes[1] * sizes[2], sizes[3] * sizes[4]
    cont = [sizes[1] * sizes[2] * r, sizes[2] * r, r, sizes[4], 1]
    full = []
    for k, s in enumerate(strides):
        want = cont if kinds[k] == "full" else [sizes[1] * sizes[2], sizes[2], 1, 0, 0]
        full.append(all(sizes[i] == 1 or s[i] == want[i] for i in range(5)))
    return sizes, strides, full, rows, r


def _kl_canon_or_copy(shape, red, ts, kinds, n_in):
    """``_kl_canon``; when the layout needs too many dims, copy the broadcast inputs dense first."""
    c = _kl_canon(shape, red, ts, kinds)
    if c is None:
        ts = list(ts)
        for k in range(n_in):
            want = shape if kinds[k] == "full" else tuple(1 if d in red else s for d, s in enumerate(shape))
            ts[k] = ts[k].expand(want).contiguous()
        c = _kl_canon(shape, red, ts, kinds)
    return ts, c
'''


# A split reduction's bounds, as its launcher applies them (and the seed's rule and the cost model with it):
# each chunk at least SPLIT_MIN_CHUNK long, and only under SPLIT_MAX_ROWS rows (the tuner's default)
SPLIT_MIN_CHUNK = 256
SPLIT_MAX_ROWS = 1024


class LoopLauncher:
    """The launcher half of ``loopgen._Gen``: reads the generator's group, graph, operands and scalars."""

    # -- split reductions -------------------------------------------------------------------------
    def split_ops(self) -> list[str] | None:
        """The reduce op of each output when the group can split its rows across programs: one level
        of sum / mean / amax / amin (no reduction reads another; a mean may have a correction, a variance's),
        every output one of those reductions, in float32 (the partials are stored in the output's type).
        None otherwise."""
        if not self.rows:
            return None
        reds = {n for n in self.grp.nodes if self.g.node(n).kind == "reduce"}
        for n in reds:
            node = self.g.node(n)
            if node.op not in ("sum", "mean", "amax", "amin") or node.attrs.get("correction") and node.op != "mean":
                return None
            stack = [a.name for a in node.args if isinstance(a, Ref)]
            while stack:  # no reduction upstream inside the group
                m = stack.pop()
                if m in reds:
                    return None
                if m in self.members:
                    stack += [a.name for a in self.g.node(m).args if isinstance(a, Ref)]
        outs = [o for o in self.operands if o.is_output]
        if not outs or any(o.value not in reds or self.g.node(o.value).dtype != "float32" for o in outs):
            return None
        return [self.g.node(o.value).op for o in outs]

    def split_branch(self, n_in: int, cs: list[str], outs: list[str], ops: list[str]) -> list[str]:
        """Launcher lines: with few rows and a long innermost reduced run, each row is cut into ``sp``
        chunks that run as rows of their own (the split index becomes the innermost kept dim); the
        kernel writes one partial per chunk and PyTorch combines the ``sp`` partials of each row (equal
        chunks: a mean of means is the mean; a chunk's mean with correction c divided its sum by r2 - c, so
        the mean of those times sp * (r2 - c) / (r - c) is the row's). The reduced run must divide evenly."""
        combine = {"sum": "sum", "mean": "mean", "amax": "amax", "amin": "amin"}
        nf = len(self.operands)
        L = ['    sp = int(cfg.get("SPLIT_R", 1))',
             f"    while sp > 1 and (sizes[4] % sp or sizes[4] // sp < {SPLIT_MIN_CHUNK}):",
             "        sp //= 2",
             f'    if sp > 1 and sizes[0] == 1 and nrows < int(cfg.get("SPLIT_MAX_ROWS", {SPLIT_MAX_ROWS})):',
             f"        ws = [torch.empty((nrows, sp), device=dev, dtype=torch.float32) for _ in range({len(outs)})]",
             "        chunk = sizes[4] // sp",
             f"        st2 = [[st[1], st[2], st[4] * chunk, st[3], st[4]] for st in strides[:{n_in}]]",
             "        st2 += [[sizes[2] * sp, sp, 1, 0, 0] for _ in ws]",
             "        flat2 = [x for st in st2 for x in st]",
             "        nr2, r2 = nrows * sp, r // sp",
             "        block_r = triton.next_power_of_2(r2)",
             '        if cfg["mode"] != "multi_pass" and block_r <= int(cfg["MAX_R"]):',
             '            block_rows = max(1, min(int(cfg["TILE"]) // block_r, triton.next_power_of_2(nr2)))',
             f"            kern = k_{self.name}_one",
             "        else:",
             '            block_r = min(block_r, int(cfg["BLOCK_R"]))',
             '            block_rows = max(1, min(int(cfg["TILE"]) // block_r, triton.next_power_of_2(nr2), 16))',
             f"            kern = k_{self.name}_loop",
             '        warps = int(cfg["num_warps"]) or max(1, min(16, block_rows * block_r // 256))',
             f"        kern[(triton.cdiv(nr2, block_rows),)](*ts[:{n_in}], *ws, {''.join(c + ', ' for c in cs)}"
             f"sizes[1], sizes[2], sp, sizes[3], chunk, nr2, r2, *flat2, BLOCK_ROWS=block_rows, BLOCK_R=block_r, "
             f"BIG=big, {', '.join(f'FULL{k}=False' for k in range(nf))}, INNER=False, num_warps=warps)"]
        values = [o.value for o in self.operands if o.is_output]
        for j, (o, op, v) in enumerate(zip(outs, ops, values, strict=True)):
            corr = self.g.node(v).attrs.get("correction") if op == "mean" else None
            scale = f" * (sp * (r2 - {literal(corr)}) / (r - {literal(corr)}))" if corr else ""
            L.append(f"        {o}.view(-1).copy_(torch.{combine[op]}(ws[{j}], dim=1){scale})")
        ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
        L.append(f"        return {ret}")
        return L

    # -- launcher ---------------------------------------------------------------------------------
    def launcher(self) -> str:
        args = [f"in_{v}" for v in self.ext_inputs]
        cs = [f"c{j}" for j in range(len(self.scalars))]
        L = [f"def launch_{self.name}({', '.join(args + cs)}):", f"    cfg = CONFIG[{self.name!r}]"]
        first = args[0] if args else None
        ins = [k for k, o in enumerate(self.operands) if not o.is_output]
        L.append("    ts = [")
        for k in ins:
            o = self.operands[k]
            L.append(f"        _kl_align(in_{o.value}, {o.lead}, {o.insert!r}),")
        L.append("    ]")
        L.append("    shape = tuple(torch.broadcast_shapes(*[t.shape for t in ts]))")
        L.append(f"    dev = next((t.device for t in ts if t.dim()), {first}.device)" if first else "    dev = None")
        red = self.red
        outs = []
        for o in self.operands:
            if not o.is_output:
                continue
            node = self.g.node(o.value)
            dt = f"torch.{node.dtype}"
            if o.kind == "full":
                L.append(f"    out_{o.value} = torch.empty(shape, device=dev, dtype={dt})")
                L.append(f"    ts.append(out_{o.value})")
            else:
                keep = len(node.shape) == self.nd
                L.append(f"    rshape = tuple(1 if d in {red!r} else s for d, s in enumerate(shape))")
                if keep:
                    L.append(f"    out_{o.value} = torch.empty(rshape, device=dev, dtype={dt})")
                    L.append(f"    ts.append(out_{o.value})")
                else:
                    L.append(f"    out_{o.value} = torch.empty(tuple(s for d, s in enumerate(shape) if d not in {red!r}), device=dev, dtype={dt})")
                    L.append(f"    ts.append(_kl_align(out_{o.value}, 0, {red!r}))")
            outs.append(f"out_{o.value}")
        kinds = [o.kind for o in self.operands]
        L.append(f"    ts, (sizes, strides, full, nrows, r) = _kl_canon_or_copy(shape, {red!r}, ts, {kinds!r}, {len(ins)})")
        ret = outs[0] if len(outs) == 1 else "(" + ", ".join(outs) + ",)"
        L.append(f"    if nrows * r == 0:\n        return {ret}")
        L.append("    big = nrows * r * 4 >= 2**31")
        L.append("    flat = [s for st in strides for s in st]")
        fulls = ", ".join(f"FULL{k}=full[{k}]" for k in range(len(self.operands)))
        if not self.rows:
            L += ["    n = nrows * r",
                  '    block = int(cfg["BLOCK"])',
                  '    warps = int(cfg["num_warps"])',
                  "    # an input read along dim 1 while the output is written along dim 2: a transpose",
                  f"    if sizes[1] > 1 and sizes[2] > 1 and any(st[1] == 1 and st[2] != 1 for st in strides[:{len(ins)}]):",
                  '        tile = int(cfg.get("TILE_2D", 64))',
                  "        grid = (sizes[0] * triton.cdiv(sizes[1], tile) * triton.cdiv(sizes[2], tile),)",
                  f"        k_{self.name}_2d[grid](*ts, {''.join(c + ', ' for c in cs)}*sizes, n, 1, *flat, BLOCK_ROWS=tile, BLOCK_R=tile, "
                  f"BIG=big, {fulls}, num_warps=warps)",
                  f"        return {ret}",
                  "    grid = (triton.cdiv(n, block),)"]
            if self.opt.get("persistent"):
                L += ['    progs = int(cfg.get("NUM_PROGS", 0))',
                      "    if progs <= 0:  # 0: four programs per SM (the interpreter: three in all)",
                      "        progs = 4 * torch.cuda.get_device_properties(dev).multi_processor_count if dev is not None "
                      "and dev.type == 'cuda' else 3",
                      "    grid = (min(grid[0], progs),)",
                      f"    k_{self.name}_persist[grid](*ts, {''.join(c + ', ' for c in cs)}*sizes, n, 1, *flat, BLOCK_ROWS=1, "
                      f"BLOCK_R=block, BIG=big, {fulls}, num_warps=warps)"]
            else:
                L += [f"    k_{self.name}[grid](*ts, {''.join(c + ', ' for c in cs)}*sizes, n, 1, *flat, BLOCK_ROWS=1, "
                      f"BLOCK_R=block, BIG=big, {fulls}, num_warps=warps)"]
        else:
            ops = self.split_ops() if int(self.opt.get("split_r", 1)) > 1 else None
            if ops is not None:
                L += self.split_branch(len(ins), cs, outs, ops)
            L += [f"    fulls_in = [st for st, kd in zip(strides[:{len(ins)}], {kinds[:len(ins)]!r}) if kd == 'full']",
                  "    inner = sizes[2] > 1 and r > 1 and bool(fulls_in) and all(st[2] == 1 and st[3] != 1 and st[4] != 1 for st in fulls_in)",
                  "    if inner:  # strided reduction, contiguous kept dim: see INNER in the kernel",
                  '        block_rows = min(int(cfg.get("INNER_ROWS", 128)), triton.next_power_of_2(sizes[2]))',
                  '        block_r = min(triton.next_power_of_2(r), max(1, int(cfg["TILE"]) // block_rows))',
                  '        warps = int(cfg["num_warps"]) or max(1, min(8, block_rows * block_r // 512))',
                  "        grid = (sizes[0] * sizes[1] * triton.cdiv(sizes[2], block_rows),)",
                  f"        k_{self.name}_loop[grid](*ts, {''.join(c + ', ' for c in cs)}*sizes, nrows, r, *flat, BLOCK_ROWS=block_rows, "
                  f"BLOCK_R=block_r, BIG=big, {fulls}, INNER=True, num_warps=warps)",
                  f"        return {ret}",
                  "    block_r = triton.next_power_of_2(r)",
                  '    mode = cfg["mode"]',
                  '    if mode == "one_pass" or (mode == "auto" and block_r <= int(cfg["MAX_R"])):',
                  '        block_rows = max(1, min(int(cfg["TILE"]) // block_r, triton.next_power_of_2(nrows)))',
                  "        kern = k_" + self.name + "_one",
                  "    else:",
                  '        block_r = min(block_r, int(cfg["BLOCK_R"]))',
                  '        block_rows = max(1, min(int(cfg["TILE"]) // block_r, triton.next_power_of_2(nrows), 16))',
                  "        kern = k_" + self.name + "_loop",
                  '    warps = int(cfg["num_warps"]) or max(1, min(16, block_rows * block_r // 256))',
                  "    grid = (triton.cdiv(nrows, block_rows),)",
                  f"    kern[grid](*ts, {''.join(c + ', ' for c in cs)}*sizes, nrows, r, *flat, BLOCK_ROWS=block_rows, BLOCK_R=block_r, BIG=big, "
                  f"{fulls}, INNER=False, num_warps=warps)"]
        L.append(f"    return {ret}")
        return "\n".join(L) + "\n"
