"""Triton code for ``pointwise`` and ``rows`` groups (see ``partition.py``).
The kernel text is Triton template text in ``loop_template.py`` (filled by ``template.render``, as
``gemm_template.py`` and ``conv_template.py`` are); this module decides what goes in the holes.

Indexing. The launcher aligns every operand to the group's domain shape D (rank nd; size-1 where it
broadcasts), then ``_kl_canon`` (emitted once per file) orders D as (kept dims, reduced dims), drops
size-1 dims and merges neighbours whose strides agree for *every* operand, giving at most 3 kept and
2 reduced dimensions with per-operand strides. A kernel decomposes its flat row index into (o0, o1,
o2) and its column index into (q0, q1) and dots them with the strides; an operand that is plainly
contiguous (``FULL_<k>``, a constexpr) uses the flat index instead, so the common case does no
integer division. All of this happens per call, so one candidate runs at any problem size.

Pointwise: a flat kernel over the domain, and a tiled one (``k_<group>_2d``) that the launcher picks
when an input is transposed relative to the output (coalesced on both sides).

Rows: ``one_pass`` keeps a [BLOCK_ROWS, BLOCK_R >= R] tile in registers and reduces along axis 1;
``multi_pass`` loops over R in chunks, one loop per reduction level, recomputing the pointwise
prologue from memory rather than keeping it; a softmax's max and sum share one loop (online
softmax), so it reads the row twice (the second read mostly from L2). ``INNER`` (chosen per call)
serves reductions over strided dims whose innermost kept dim is contiguous: the row tile runs along
that dim, so loads coalesce. The
launcher picks per call (``mode``: auto | one_pass | multi_pass) from R and ``MAX_R``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..ir import Dyn, Graph, Node, Ref
from ..partition import Group
from . import loop_template as T
from .loop_launcher import LoopLauncher
from .pointwise import BOOL_OPS, emit_pw, literal, round_to
from .template import render

__all__ = ["loop_kernel", "LoopSource", "pointwise_defaults", "split_reduction_ok"]

@dataclass
class LoopSource:
    name: str
    source: str  # kernels + launcher
    config: dict
    space: dict
    inputs: list[str]  # graph values passed to the launcher, in order
    outputs: list[str]  # graph values returned, in order
    scalars: list[str] = field(default_factory=list)  # run-time numbers (Dyn exprs), after the tensors
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Operand:
    value: str  # graph value name
    lead: int
    insert: tuple[int, ...]
    kind: str  # full | row
    is_output: bool = False

    @property
    def key(self) -> tuple:
        return (self.value, self.lead, self.insert)


_TL_DTYPE = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16"}


def _store_cast(val: str, dt: str) -> str:
    if dt == "tl.bfloat16":  # round exactly first: see pointwise.round_to
        return f"_kl_bf16({val}).to(tl.bfloat16)"
    return f"({val}).to({dt})"


def _rank(graph: Graph, name: str) -> int:
    shape = graph.node(name).shape
    return len(shape) if shape is not None else 0


class _Gen(LoopLauncher):
    """Kernel text for one group (the launcher's text: ``loop_launcher.LoopLauncher``)."""

    def __init__(self, graph: Graph, grp: Group, options: dict):
        self.g, self.grp, self.opt = graph, grp, options
        self.rows = grp.kind == "rows"
        self.nd = len(grp.domain)
        self.red = tuple(grp.red_dims)
        self.members = set(grp.nodes)
        self.kind = {n: self.value_kind(n) for n in grp.nodes}
        self.operands: list[_Operand] = []
        self.ext_inputs: list[str] = []  # launcher arguments (unique graph values)
        self.scalars: list[str] = []  # Dyn expressions, kernel params c0, c1...
        self.name = grp.id

    def value_kind(self, name: str) -> str:
        if not self.rows:
            return "full"
        shape = self.g.node(name).shape
        return "full" if shape == tuple(self.grp.domain) else "row"

    def value_kind_of_shape(self, shape: tuple[int, ...]) -> str:
        return "full" if not self.rows or tuple(shape) == tuple(self.grp.domain) else "row"

    def align(self, consumer: Node, value: str) -> tuple[int, tuple[int, ...]]:
        """How an outside value read by ``consumer`` lines up with the domain."""
        # right-aligned broadcasting composes: an operand lines up with the domain as it lines up
        # with its consumer, except below a reduction that dropped its dims (keepdim=False)
        cshape = consumer.shape
        if consumer.kind == "reduce" and self.value_kind_of_shape(self.g.node(value).shape or ()) == "full":
            cshape = tuple(self.grp.domain)  # a reduction reads its input over the whole domain
        if self.rows and len(cshape) == self.nd - len(self.red) and cshape != tuple(self.grp.domain):
            return max(len(cshape) - _rank(self.g, value), 0), self.red
        return max(self.nd - _rank(self.g, value), 0), ()

    def operand(self, value: str, lead: int, insert: tuple[int, ...], kind: str, out: bool = False) -> int:
        op = _Operand(value, lead, insert, kind, out)
        for i, o in enumerate(self.operands):
            if o.key == op.key and o.is_output == out:
                return i
        self.operands.append(op)
        if not out and value not in self.ext_inputs:
            self.ext_inputs.append(value)
        return len(self.operands) - 1

    # -- collecting operands ----------------------------------------------------------------------
    def collect(self) -> None:
        for name in self.grp.nodes:
            node = self.g.node(name)
            for a in node.args:
                if isinstance(a, Dyn) and a.expr not in self.scalars:
                    self.scalars.append(a.expr)
                if isinstance(a, Ref) and a.name not in self.members:
                    lead, insert = self.align(node, a.name)
                    kind = self.kind[name] if node.kind == "pw" else "full"
                    if node.kind == "reduce" and self.kind.get(name) == "row" and \
                            self.g.node(a.name).shape != tuple(self.grp.domain):
                        kind = "row"
                    self.operand(a.name, lead, insert, kind)
        for name in self.grp.outputs:
            node = self.g.node(name)
            kind = self.kind[name]
            insert = self.red if (kind == "row" and len(node.shape) == self.nd - len(self.red)) else ()
            self.operand(name, 0, insert, kind, out=True)

    # -- kernel text ------------------------------------------------------------------------------
    def params(self) -> list[str]:
        ps = [f"t{k}" for k in range(len(self.operands))]
        ps += [f"c{j}" for j in range(len(self.scalars))]
        ps += ["S0", "S1", "S2", "R0", "R1", "NROWS", "R"]
        for k in range(len(self.operands)):
            ps += [f"s{k}_{j}" for j in range(5)]
        ps += ["BLOCK_ROWS: tl.constexpr", "BLOCK_R: tl.constexpr", "BIG: tl.constexpr"]
        ps += [f"FULL{k}: tl.constexpr" for k in range(len(self.operands))]
        if self.rows:
            ps.append("INNER: tl.constexpr")
        return ps

    def row_offsets(self) -> list[str]:
        return [ln for k in range(len(self.operands)) for ln in render(T.ROW_OFFSET, K=str(k))]

    def col_lines(self, start: str) -> list[str]:
        return render(T.COLUMNS, START=start)

    def load(self, k: int) -> list[str]:
        op = self.operands[k]
        dt = self.g.node(op.value).dtype
        cast = "" if dt == "bool" else ".to(tl.float32)"
        other = "0" if dt == "bool" else "0.0"
        if op.kind == "full":
            return render(T.FULL_OFFSET, K=str(k)) + render(T.LOAD_FULL, K=str(k), OTHER=other, CAST=cast)
        return render(T.LOAD_ROW, K=str(k), OTHER=other, CAST=cast)

    def expr(self, node: Node, env: dict[str, str]) -> str:
        args, raw = [], []
        for a in node.args:
            raw.append(a)
            if isinstance(a, Ref):
                args.append(env[a.name] if a.name in self.members else env[("in", self.align_key(node, a.name))])
            elif isinstance(a, Dyn):
                args.append(f"c{self.scalars.index(a.expr)}")
            elif a is None:
                args.append("None")
            else:
                args.append(literal(a))
        return emit_pw(node.op, args, node.attrs, raw)

    def align_key(self, node: Node, value: str) -> int:
        lead, insert = self.align(node, value)
        for i, o in enumerate(self.operands):
            if o.key == (value, lead, insert) and not o.is_output:
                return i
        raise KeyError(value)

    def needed_full(self, targets: list[str], avail: set[str]) -> list[str]:
        """Group nodes (full shape, not yet available) needed to compute ``targets``, topo order."""
        need: set[str] = set()

        def visit(n: str) -> None:
            if n in need or n in avail or n not in self.members:
                return
            need.add(n)
            node = self.g.node(n)
            if node.kind == "reduce" and self.kind[n] == "row" and n not in targets:
                return
            for r in node.refs():
                visit(r)
        for t in targets:
            visit(t)
        return [n for n in self.grp.nodes if n in need]

    def emit_nodes(self, names: list[str], env: dict[str, str], in_loop: bool, loaded: set[int],
                   accs: dict[str, str] | None = None) -> list[str]:
        lines: list[str] = []
        for name in names:
            node = self.g.node(name)
            for a in node.args:
                if isinstance(a, Ref) and a.name not in self.members:
                    k = self.align_key(node, a.name)
                    if k not in loaded and (self.operands[k].kind == "full" or not self.rows):
                        lines += self.load(k) if self.rows else self.flat_load(k)
                        loaded.add(k)
                    env[("in", k)] = f"x{k}"
            var = f"v_{name}"
            if node.kind == "pw":
                e = self.expr(node, env)
                if node.dtype in ("float16", "bfloat16"):
                    # the reference rounds every op's result to its storage type: so do we
                    e = round_to(e, node.dtype)
                lines.append(f"{var} = {e}")
            elif node.kind == "reduce":
                src = node.args[0].name
                if self.kind.get(src, "full") == "row" and self.g.node(src).shape != tuple(self.grp.domain):
                    lines.append(f"{var} = {env[src] if src in self.members else env[('in', self.align_key(node, src))]}")
                elif accs is not None:
                    acc = accs[name]
                    x = env[src] if src in self.members else env[("in", self.align_key(node, src))]
                    if node.op in ("sum", "mean"):
                        lines.append(f"{acc} += tl.where(mask, {x}, 0.0)")
                    elif node.op == "amax":
                        lines.append(f"{acc} = tl.maximum({acc}, tl.where(mask, {x}, float(\"-inf\")))")
                    else:
                        lines.append(f"{acc} = tl.minimum({acc}, tl.where(mask, {x}, float(\"inf\")))")
                    continue
                else:
                    x = env[src] if src in self.members else env[("in", self.align_key(node, src))]
                    lines.append(f"{var} = {self.reduce_expr(node, x)}")
            env[name] = var
        return lines

    def reduce_expr(self, node: Node, x: str) -> str:
        if node.op in ("sum", "mean"):
            e = f"tl.sum(tl.where(mask, {x}, 0.0), axis=1)[:, None]"
        elif node.op == "amax":
            e = f'tl.max(tl.where(mask, {x}, float("-inf")), axis=1)[:, None]'
        else:
            e = f'tl.min(tl.where(mask, {x}, float("inf")), axis=1)[:, None]'
        return self.finish_mean(node, e)

    def finish_mean(self, node: Node, e: str) -> str:
        if node.op != "mean":
            return e
        corr = node.attrs.get("correction")
        return f"{e} / (R - {literal(corr)})" if corr else f"{e} / R"

    def store(self, k: int, env: dict[str, str]) -> list[str]:
        op = self.operands[k]
        val = env[op.value]
        dt = _TL_DTYPE.get(self.g.node(op.value).dtype, "tl.float32")
        if self.g.node(op.value).dtype == "bool":
            dt = "tl.int1"
        value = _store_cast(val, dt)
        if op.kind == "full":
            return render(T.FULL_OFFSET, K=str(k)) + render(T.STORE_FULL, K=str(k), VALUE=value)
        return render(T.STORE_ROW, K=str(k), VALUE=value)

    # -- rows kernels -----------------------------------------------------------------------------
    def one_pass(self) -> str:
        env: dict[str, str] = {}
        inner = self.col_lines("")
        loaded: set[int] = set()
        for k, op in enumerate(self.operands):  # per-row operands: one load per row
            if op.kind == "row" and not op.is_output:
                inner += self.load(k)
                loaded.add(k)
        inner += self.emit_nodes(list(self.grp.nodes), env, False, loaded)
        for k, op in enumerate(self.operands):
            if op.is_output:
                inner += self.store(k, env)
        return self.kernel_def(f"k_{self.name}_one", self.rows_program(inner))

    def rows_program(self, body: list[str]) -> list[str]:
        return render(T.ROWS, ROW_OFFSETS=self.row_offsets(), BODY=body)

    def online_pairs(self, reds: list[str]) -> dict[str, str]:
        """``{s: m}`` for each ``s = sum(exp(X - m))`` with ``m = amax(X)`` over the same rows (the
        softmax / log_softmax expansion): the loop kernel computes both in one read of X (online
        softmax: the running sum is rescaled whenever the running max grows), so a softmax costs
        two reads and one write instead of three reads and one write."""
        out: dict[str, str] = {}
        for name in reds:
            s_node = self.g.node(name)
            if s_node.op != "sum" or not isinstance(s_node.args[0], Ref) or s_node.args[0].name not in self.members:
                continue
            e = self.g.node(s_node.args[0].name)
            if e.kind != "pw" or e.op != "exp" or not isinstance(e.args[0], Ref) or e.args[0].name not in self.members:
                continue
            t = self.g.node(e.args[0].name)
            if t.kind != "pw" or t.op != "sub" or len(t.args) != 2 or not all(isinstance(a, Ref) for a in t.args):
                continue
            x, m = t.args[0].name, t.args[1].name
            if m not in reds or self.g.node(m).op != "amax" or not isinstance(self.g.node(m).args[0], Ref) \
                    or self.g.node(m).args[0].name != x or self.g.node(x).shape != tuple(self.grp.domain):
                continue
            if m not in out.values():
                out[name] = m
        return out

    def online_update(self, sm: str, m: str, x: str, env: dict, loaded: set[int]) -> list[str]:
        lines: list[str] = []
        if x in self.members:
            xv = env[x]
        else:
            k = self.align_key(self.g.node(m), x)
            if k not in loaded:
                lines += self.load(k)
                loaded.add(k)
            xv = f"x{k}"
        return lines + render(T.ONLINE_UPDATE, MAX=m, SUM=sm, X=xv)

    def multi_pass(self) -> str:
        dom = tuple(self.grp.domain)
        reds = [n for n in self.grp.nodes if self.g.node(n).kind == "reduce"
                and self.g.node(self.g.node(n).args[0].name).shape == dom]
        online = self.online_pairs(reds)
        levels: dict[str, int] = {}
        for name in self.grp.nodes:
            node = self.g.node(name)
            lv = max((levels.get(r, 0) for r in node.refs() if r in self.members), default=0)
            levels[name] = lv + (name in reds and name not in online)
        depth = max((levels[n] for n in reds), default=0)
        env: dict[str, str] = {}
        avail: set[str] = set()
        body: list[str] = []
        loaded_rows: set[int] = set()
        for k, op in enumerate(self.operands):
            if op.kind == "row" and not op.is_output:
                body += self.load(k)
                loaded_rows.add(k)
                env[("in", k)] = f"x{k}"
        for lv in range(1, depth + 1):
            targets = [n for n in reds if levels[n] == lv]
            pairs = [(sm, m) for sm, m in online.items() if m in targets]
            paired = {x for pair in pairs for x in pair}
            generic = [n for n in targets if n not in paired]
            accs = {n: f"acc_{n}" for n in generic}
            for n in generic:
                init = "0.0" if self.g.node(n).op in ("sum", "mean") else (
                    'float("-inf")' if self.g.node(n).op == "amax" else 'float("inf")')
                body += render(T.ACC_INIT, N=n, INIT=init)
            for sm, m in pairs:
                body += render(T.ONLINE_INIT, MAX=m, SUM=sm)
            xs = [self.g.node(m).args[0].name for _, m in pairs]
            need = [n for n in self.needed_full(generic + xs, avail) if n not in generic] + generic
            loop = self.col_lines("start + ")
            lenv, lloaded = dict(env), set(loaded_rows)
            loop += self.emit_nodes(need, lenv, True, lloaded, accs)
            for (sm, m), x in zip(pairs, xs, strict=True):
                loop += self.online_update(sm, m, x, lenv, lloaded)
            body += render(T.R_LOOP, BODY=loop)
            for sm, m in pairs:
                body += render(T.ONLINE_DONE, MAX=m, SUM=sm)
                env[m], env[sm] = f"v_{m}", f"v_{sm}"
                avail |= {m, sm}
            for n in generic:
                fn = {"sum": "tl.sum", "mean": "tl.sum", "amax": "tl.max", "amin": "tl.min"}[self.g.node(n).op]
                body.append(f"v_{n} = {self.finish_mean(self.g.node(n), f'{fn}(acc_{n}, axis=1)[:, None]')}")
                env[n] = f"v_{n}"
                avail.add(n)
            # per-row values that are now computable
            for n in self.grp.nodes:
                if n in avail or n in reds or self.kind[n] != "row" or levels[n] > lv:
                    continue
                if all(r in avail for r in self.g.node(n).refs() if r in self.members):
                    body += self.emit_nodes([n], env, False, loaded_rows)
                    avail.add(n)
        # stores: per-row outputs after the passes, full outputs in one more loop
        for k, op in enumerate(self.operands):
            if op.is_output and op.kind == "row":
                body += self.store(k, env)
        full_outs = [k for k, op in enumerate(self.operands) if op.is_output and op.kind == "full"]
        if full_outs:
            loop = self.col_lines("start + ")
            lenv = dict(env)
            targets = [self.operands[k].value for k in full_outs]
            loop += self.emit_nodes(self.needed_full(targets, avail), lenv, True, set(loaded_rows))
            for k in full_outs:
                loop += self.store(k, lenv)
            body += render(T.R_LOOP, BODY=loop)
        return self.kernel_def(f"k_{self.name}_loop", self.rows_program(body))

    # -- pointwise kernel -------------------------------------------------------------------------
    def flat_load(self, k: int) -> list[str]:
        op = self.operands[k]
        dt = self.g.node(op.value).dtype
        cast = "" if dt == "bool" else ".to(tl.float32)"
        other = "0" if dt == "bool" else "0.0"
        return render(T.LOAD_FULL, K=str(k), OTHER=other, CAST=cast)

    def flat(self) -> str:
        offsets = [ln for k in range(len(self.operands)) for ln in render(T.FLAT_OFFSET, K=str(k))]
        return self.kernel_def(f"k_{self.name}", render(T.FLAT, OFFSETS=offsets, BODY=self.pointwise_body()))

    def persistent(self) -> str:
        """The flat kernel as a grid-stride loop: about a few programs per SM walk the blocks, so a big
        domain pays for one program launch per SM instead of one per block."""
        offsets = [ln for k in range(len(self.operands)) for ln in render(T.FLAT_OFFSET, K=str(k))]
        return self.kernel_def(f"k_{self.name}_persist",
                               render(T.PERSISTENT, OFFSETS=offsets, BODY=self.pointwise_body()))

    def tiled(self) -> str:
        """Pointwise over a [BLOCK_ROWS, BLOCK_R] tile of (dim 1, dim 2) per program: when an input is
        contiguous along dim 1 but the output along dim 2 (a transpose), each side's accesses are
        coalesced and Triton swaps the layout through shared memory in between (strides of 1 are
        specialised to constants, which is what lets it see the contiguity)."""
        offsets = [ln for k in range(len(self.operands)) for ln in render(T.TILED_OFFSET, K=str(k))]
        return self.kernel_def(f"k_{self.name}_2d", render(T.TILED, OFFSETS=offsets, BODY=self.pointwise_body()))

    def pointwise_body(self) -> list[str]:
        """The group's ops and the masked stores of its outputs, over the offsets ``f{k}`` and ``mask``:
        the tail shared by the flat, persistent and tiled pointwise kernels."""
        env: dict[str, str] = {}
        body = self.emit_nodes(list(self.grp.nodes), env, False, set())
        for k, op in enumerate(self.operands):
            if op.is_output:
                dt = _TL_DTYPE.get(self.g.node(op.value).dtype, "tl.int1")
                body += render(T.STORE_FULL, K=str(k), VALUE=_store_cast(env[op.value], dt))
        return body

    def kernel_def(self, name: str, body: list[str]) -> str:
        ops = ", ".join(f"t{k}={'out ' if o.is_output else ''}{o.value}" for k, o in enumerate(self.operands))
        return "\n".join(render(T.KERNEL, NAME=name, PARAMS=[p + "," for p in self.params()], OPERANDS=ops,
                                BODY=body)) + "\n"


ONE_PASS_MAX_R = 32768  # the one_pass action's MAX_R: a 128 KiB fp32 row over 16 warps, 64 registers a thread
WIDE_MIN = 1 << 21  # elements: 4096-wide blocks still give >= 512 programs (about 4 per SM)


def pointwise_defaults(domain: tuple[int, ...] | None) -> dict[str, int]:
    """Seed tiles of a flat pointwise kernel: 4096 elements and 8 warps on large domains (the
    "vectorised loads" action won every time it was tried on the H200 bench: pointwise_chain,
    silu_bf16, gelu_tanh_manual), 1024 and 4 warps below ``WIDE_MIN`` so that small ones still
    spread over the SMs."""
    n = 1
    for d in domain or ():
        n *= int(d)
    return {"BLOCK": 4096, "num_warps": 8} if n >= WIDE_MIN else {"BLOCK": 1024, "num_warps": 4}


def split_reduction_ok(graph: Graph, grp: Group) -> bool:
    """Can rows group ``grp`` run as a split reduction (``_Gen.split_ops``)?"""
    if grp.kind != "rows":
        return False
    gen = _Gen(graph, grp, {})
    gen.collect()
    return gen.split_ops() is not None


def loop_kernel(graph: Graph, grp: Group, options: dict | None = None) -> LoopSource:
    """Kernel(s) and launcher for one pointwise or rows group."""
    options = options or {}
    gen = _Gen(graph, grp, options)
    gen.collect()
    if grp.kind == "pointwise":
        kernels = [gen.persistent() if options.get("persistent") else gen.flat(), gen.tiled()]
        dflt = pointwise_defaults(grp.domain)
        # TILE_2D: 64x64 fp32 = 16 KB through shared memory, 256-byte runs on both sides of a transpose
        config = {"BLOCK": int(options.get("BLOCK", dflt["BLOCK"])), "num_warps": int(options.get("num_warps", dflt["num_warps"])),
                  "TILE_2D": int(options.get("TILE_2D", 64))}
        space = {"BLOCK": [256, 512, 1024, 2048, 4096], "num_warps": [2, 4, 8], "TILE_2D": [32, 64, 128]}
        if options.get("persistent"):
            config["NUM_PROGS"] = int(options.get("NUM_PROGS", 0))
    else:
        mode = options.get("mode", "auto")
        kernels = []
        if mode in ("auto", "one_pass"):
            kernels.append(gen.one_pass())
        if mode in ("auto", "multi_pass"):
            kernels.append(gen.multi_pass())
        max_r = 8192
        if mode == "one_pass":
            kernels.append(gen.multi_pass())  # the launcher still needs it when R is beyond one tile
            mode = "auto"
            # the action's point: rows up to ONE_PASS_MAX_R stay in registers (auto loops beyond 8192),
            # which reads a softmax's row once instead of twice; longer rows still loop
            max_r = ONE_PASS_MAX_R
        # INNER_ROWS: 128 neighbours along a contiguous kept dim = 512 B per tile row in fp32
        config = {"mode": mode, "MAX_R": int(options.get("MAX_R", max_r)), "TILE": int(options.get("TILE", 4096)),
                  "BLOCK_R": int(options.get("BLOCK_R", 2048)), "num_warps": int(options.get("num_warps", 0)),
                  "INNER_ROWS": int(options.get("INNER_ROWS", 128))}
        space = {"MAX_R": [1024, 4096, 8192, 16384], "TILE": [1024, 2048, 4096, 8192],
                 "BLOCK_R": [512, 1024, 2048, 4096], "num_warps": [0, 2, 4, 8, 16], "INNER_ROWS": [32, 64, 128, 256]}
        if int(options.get("split_r", 1)) > 1 and gen.split_ops() is not None:
            config["SPLIT_R"] = int(options.get("SPLIT_R", options["split_r"]))
            space["SPLIT_R"] = sorted({1, 4, 16, 64, 256, config["SPLIT_R"]})
        if config["MAX_R"] not in space["MAX_R"]:  # the tuner refuses a default outside its SPACE
            space["MAX_R"] = sorted([*space["MAX_R"], config["MAX_R"]])
    src = "\n\n".join(kernels) + "\n\n" + gen.launcher()
    return LoopSource(grp.id, src, config, space, list(gen.ext_inputs), [o.value for o in gen.operands if o.is_output],
                      scalars=list(gen.scalars))


_ = (Any, BOOL_OPS)
