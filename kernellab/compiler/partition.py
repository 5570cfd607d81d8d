"""Partition the IR graph into fusion groups, greedily in topological order.

Group kinds:
- ``pointwise``  pw nodes of one shape: one flat kernel;
- ``rows``       reductions over the same dims of one *domain* shape, with the pw nodes before them
                 (prologue, full shape) and after them (epilogue, full or reduced shape): one kernel
                 that keeps a tile of rows and reduces along its columns;
- ``gemm``       one GEMM, its pw epilogue chain (bias, scale, activation, residual: operands that
                 broadcast as a row, a column, a matrix or a scalar) and optionally a row reduction
                 over N recognised from the ``origin`` tags of the expanded softmax / log_softmax /
                 logsumexp / layer_norm / sum / max, then a row epilogue;
- ``conv``       one convolution (``conv.py``) and the pointwise DAG after it (bias, activations,
                 scaling, residuals: operands that broadcast to the output), one output; optionally
                 then a sum/mean/max/min over all spatial dims (global pooling, ``row_reduction``) or
                 over the channels (<= 256, groups 1);
- ``special``    one scan / gather / pooling node with a template of its own (``special.py``);
- ``torch``      one view / opaque / getitem node, or a node an action sent back to PyTorch.

A node may join a group unless a value it reads from outside comes from a group that (transitively)
reads the group itself: the group dependency graph stays acyclic and groups run in its order. A rows group
of few long rows that reads its own reduction (a training BatchNorm, a Frobenius norm) is cut into split
reductions and a pointwise pass where that works (``_split_norm_cuts``).
Options (``Options``) come from the replayed actions: ``cuts`` (nodes that must start a new group),
``torch_nodes`` (nodes run by PyTorch), ``no_row_fusion`` (GEMM groups that keep their row
reduction out) and ``library_gemm`` (GEMMs run by cuBLAS, their epilogue then a pointwise group).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .ir import FLOAT_DTYPES, Graph, Node, Ref, Sym

__all__ = ["Group", "Options", "partition", "reduce_runs_ok", "ROW_BLOCKS"]

# origin op -> the template's row_reduction name (GEMM + row reduction fusion)
ROW_BLOCKS = {"softmax": "softmax", "_softmax": "softmax", "log_softmax": "log_softmax",
              "_log_softmax": "log_softmax", "logsumexp": "logsumexp", "layer_norm": "layernorm",
              "sum": "sum", "amax": "max", "max": "max"}


@dataclass(frozen=True)
class Options:
    cuts: frozenset[str] = frozenset()
    torch_nodes: frozenset[str] = frozenset()
    no_row_fusion: frozenset[str] = frozenset()
    library_gemm: frozenset[str] = frozenset()


@dataclass
class Group:
    id: str
    kind: str  # pointwise | rows | gemm | conv | special | torch
    nodes: list[str]
    domain: tuple[int, ...] | None = None
    red_dims: tuple[int, ...] = ()
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    # gemm groups (conv groups: ``gemm`` is the conv node, ``epilogue`` its pw DAG in order)
    gemm: str | None = None
    epilogue: list[str] = field(default_factory=list)
    row_block: list[str] = field(default_factory=list)
    row_reduction: str | None = None
    row_epilogue: list[str] = field(default_factory=list)
    operand_kinds: dict[str, str] = field(default_factory=dict)
    closed: bool = False

    @property
    def tail(self) -> str:
        return self.nodes[-1]

    def describe(self, graph: Graph) -> str:
        if self.kind == "torch":
            return f"{self.id}: PyTorch {graph.node(self.nodes[0]).op}"
        ops = [graph.node(n).op for n in self.nodes]
        extra = f" + row {self.row_reduction}" if self.row_reduction else ""
        return f"{self.id}: {self.kind}{extra} [{', '.join(ops)}]"


def reduce_runs_ok(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    """The row kernel indexes at most 3 runs of kept dims and 2 runs of reduced dims."""
    red_runs = keep_runs = 0
    prev = None
    for i in range(len(shape)):
        r = i in dims
        if r != prev:
            red_runs += r
            keep_runs += not r
        prev = r
    return red_runs <= 2 and keep_runs <= 3 and bool(dims)


def _broadcasts(small: tuple[int, ...], big: tuple[int, ...]) -> bool:
    if len(small) > len(big):
        return False
    return all(s in (1, b) for s, b in zip(reversed(small), reversed(big), strict=False))


def _reduced(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


class _Partitioner:
    def __init__(self, graph: Graph, options: Options):
        self.g, self.o = graph, options
        self.groups: list[Group] = []
        self.group_of: dict[str, Group] = {}
        self.start: dict[str, int] = {}  # group id -> position of its first node
        self.deps: dict[str, set[str]] = {}  # group id -> ids of the groups it reads from
        self.outputs = graph.output_names()

    # -- helpers ----------------------------------------------------------------------------------
    def new(self, kind: str, node: Node, **kw) -> Group:
        grp = Group(id=f"g_{node.name}", kind=kind, nodes=[], **kw)
        self.groups.append(grp)
        self.start[grp.id] = self.g.position[node.name]
        self.add(grp, node)
        return grp

    def add(self, grp: Group, node: Node) -> None:
        grp.nodes.append(node.name)
        self.group_of[node.name] = grp
        for r in node.refs():
            h = self.group_of.get(r)
            if h is not None and h is not grp:
                self.deps.setdefault(grp.id, set()).add(h.id)

    def depends_on(self, h: Group, grp: Group) -> bool:
        """Does group ``h`` read (transitively) a value of ``grp``?"""
        seen, todo = set(), [h.id]
        while todo:
            gid = todo.pop()
            if gid == grp.id:
                return True
            if gid in seen:
                continue
            seen.add(gid)
            todo.extend(self.deps.get(gid, ()))
        return False

    def ready_before(self, grp: Group, node: Node, also: set[str] = frozenset()) -> bool:
        """``node`` may join ``grp`` unless one of its outside inputs comes from a group that reads
        ``grp`` (the groups would wait on each other)."""
        for r in node.refs():
            h = self.group_of.get(r)
            if h is grp or r in also or h is None:
                continue
            if self.depends_on(h, grp):
                return False
        return True

    def only_user(self, name: str, user: str) -> bool:
        return self.g.users[name] == [user] and name not in self.outputs

    # -- rules ------------------------------------------------------------------------------------
    def row_kind(self, grp: Group, shape: tuple[int, ...]) -> str | None:
        if shape == grp.domain:
            return "full"
        if shape in (_reduced(grp.domain, grp.red_dims, True), _reduced(grp.domain, grp.red_dims, False)):
            return "row"
        return None

    def try_join(self, grp: Group, n: Node) -> bool:
        if grp.closed or not self.ready_before(grp, n):
            return False
        if grp.kind == "pointwise":
            if n.kind == "pw" and n.shape == grp.domain:
                self.add(grp, n)
                return True
            if n.kind == "reduce" and self.g.node(n.args[0].name).shape == grp.domain \
                    and reduce_runs_ok(grp.domain, n.attrs["dims"]):
                grp.kind, grp.red_dims = "rows", tuple(n.attrs["dims"])
                self.add(grp, n)
                return True
            return False
        if grp.kind == "rows":
            if n.kind == "reduce":
                src = self.g.node(n.args[0].name)
                if tuple(n.attrs["dims"]) == grp.red_dims and src.shape == grp.domain:
                    self.add(grp, n)
                    return True
                # a sum over the size-1 dims of a row value is a squeeze (logsumexp without keepdim)
                if self.group_of.get(src.name) is grp and self.row_kind(grp, src.shape) == "row" \
                        and tuple(n.attrs["dims"]) == grp.red_dims and n.op == "sum" \
                        and self.row_kind(grp, n.shape) == "row":
                    self.add(grp, n)
                    return True
                return False
            if n.kind == "pw":
                kind = self.row_kind(grp, n.shape)
                if kind is None:
                    return False
                if kind == "row":  # a per-row value cannot read a full-shape group value
                    for r in n.refs():
                        if self.group_of.get(r) is grp and self.row_kind(grp, self.g.node(r).shape) != "row":
                            return False
                self.add(grp, n)
                return True
            return False
        if grp.kind == "gemm":
            return self.join_gemm(grp, n)
        return False

    def operand_kind(self, grp: Group, name: str, vector: bool) -> str | None:
        """How an outside value broadcasts over the GEMM output [..., M, N] (None: it does not)."""
        node = self.g.node(name)
        if node.dtype is not None and node.dtype not in FLOAT_DTYPES + ("float64",):
            return None  # the GEMM launcher loads floating operands only (a bool mask stays a kernel's input)
        shape = node.shape
        out = grp.domain if not vector else grp.domain[:-1]
        if shape is None or len(shape) > len(out):
            return None
        s = (1,) * (len(out) - len(shape)) + tuple(shape)
        batched = self.g.node(grp.gemm).op == "bmm"
        lead = s[:-2] if not vector else s[:-1]
        if vector:  # per-row values: [..., M] with M flattened from the leading dims
            if all(d == 1 for d in s):
                return "col"
            return "col" if s == tuple(out) else None
        if all(d == 1 for d in s):
            return "row"
        if s[-2:-1] == (1,) and all(d == 1 for d in lead):
            return "row"
        if batched:
            if s == tuple(out):
                return "matrix"
            if s[-1] == 1 and s[:-1] == tuple(out[:-1]):
                return "col"
            return None
        if s == tuple(out):
            return "matrix"
        if s[-1] == 1 and s[:-1] == tuple(out[:-1]):
            return "col"
        return None

    def join_gemm(self, grp: Group, n: Node) -> bool:
        tail = grp.tail
        if tail not in n.refs():
            return False
        if n.kind == "pw" and not grp.row_reduction and self.only_user(tail, n.name):
            if n.shape != grp.domain:
                return False
            return self.take_epilogue(grp, n, grp.epilogue, vector=False)
        if n.kind in ("pw", "reduce") and not grp.row_reduction and grp.id not in self.o.no_row_fusion:
            return self.join_row_block(grp, n)
        if n.kind == "pw" and grp.row_reduction and self.only_user(tail, n.name):
            vector = grp.row_reduction in ("logsumexp", "sum", "max")
            want = grp.domain[:-1] if vector else grp.domain
            if n.shape not in (want, want + (1,) if vector else want):
                return False
            return self.take_epilogue(grp, n, grp.row_epilogue, vector=vector)
        return False

    def take_epilogue(self, grp: Group, n: Node, into: list[str], vector: bool) -> bool:
        """Add ``n`` to the GEMM group as an epilogue op (listed in ``into``), if its operands allow."""
        kinds = self.epilogue_operands(grp, n, vector=vector)
        if kinds is None:
            return False
        grp.operand_kinds.update(kinds)
        into.append(n.name)
        self.add(grp, n)
        return True

    def epilogue_operands(self, grp: Group, n: Node, vector: bool) -> dict | None:
        """Operand kinds of ``n``'s inputs other than the GEMM tail; None when one cannot be an
        epilogue operand (it is computed inside the group, or has no loadable kind)."""
        kinds = {}
        for r in n.refs():
            if r == grp.tail:
                continue
            if self.group_of.get(r) is grp:
                return None
            k = self.operand_kind(grp, r, vector=vector)
            if k is None:
                return None
            kinds[r] = k
        return kinds

    def join_row_block(self, grp: Group, n: Node) -> bool:
        """Absorb a whole expanded softmax/layer_norm/... whose first node reads the GEMM tail."""
        origin = n.origin
        op = origin.split(":")[0] if origin else (n.op if n.kind == "reduce" else "")
        red = ROW_BLOCKS.get(op)
        if red is None:
            return False
        block = [m for m in self.g.nodes if m.origin == origin] if origin else [n]
        if not block or block[0].name != n.name:
            return False
        names = {m.name for m in block}
        if grp.tail in self.outputs or any(u not in names for u in self.g.users[grp.tail]):
            return False
        last = len(grp.domain) - 1
        names = {m.name for m in block}
        final = block[-1]
        for m in block:
            if m.kind == "reduce" and tuple(m.attrs["dims"]) != (last,):
                return False
            if m.kind not in ("pw", "reduce"):
                return False
            if m is not final and any(u not in names for u in self.g.users[m.name]):
                return False
        if final.kind == "reduce" and final.attrs.get("correction") is not None:
            return False
        if red == "sum" and final.op != "sum" or red == "max" and final.op != "amax":
            return False
        ln_ops: dict[str, str] = {}
        if red == "layernorm":
            ext = [r for m in block for r in m.refs() if r not in names and r != grp.tail]
            # the affine weight and bias of layer_norm: the expansion multiplies then adds them
            muls = [m for m in block if m.op == "mul" and any(r in ext for r in m.refs())]
            adds = [m for m in block if m.op == "add" and any(r in ext for r in m.refs())]
            if len(muls) > 1 or len(adds) > 1:
                return False
            for label, lst in (("ln_weight", muls), ("ln_bias", adds)):
                if lst:
                    r = next(r for r in lst[0].refs() if r in ext)
                    if self.operand_kind(grp, r, vector=False) != "row":
                        return False
                    ln_ops[r] = label
            eps_nodes = [m for m in block if m.op == "add" and isinstance(m.args[1], float)]
            grp.__dict__["ln_eps"] = eps_nodes[0].args[1] if eps_nodes else 1e-5
        else:
            for m in block:
                if any(r not in names and r != grp.tail for r in m.refs()):
                    return False
        if not all(self.ready_before(grp, m, also=names) for m in block):
            return False
        grp.__dict__["ln_operands"] = ln_ops
        grp.row_reduction = red
        grp.row_block = [m.name for m in block]
        for m in block:
            self.add(grp, m)
        return True

    def take_conv_epilogue(self, grp: Group) -> None:
        """Claim the pointwise DAG that follows a convolution (bias, activations, scaling, residuals:
        a value may feed several of its ops, as ``x * clamp(x + 3)`` does) as its epilogue. Candidates
        are the later pw nodes of the output's shape that read the group, with operands that broadcast
        to the output; a smaller pw node computed from parameters alone (an eval BatchNorm's
        ``rsqrt(var + eps)``) is recomputed per element inside. The group then ends at the latest
        candidate whose ancestors inside the group are read by nothing outside it (one output)."""
        conv = grp.gemm
        members, derived, order, kinds, late = {conv}, {conv}, [conv], {}, set()

        def param_view(r: str) -> bool:  # a view of parameters/inputs, partitioned later (a torch group)
            n = self.g.node(r)
            if n.kind in ("input", "param"):
                return True
            return n.kind == "view" and r not in self.group_of and all(param_view(x) for x in n.refs())

        # all channels in one tile (groups 1, <= 256): reductions over them (keepdim: softmax, logsumexp,
        # a channel mean...) run in registers inside the epilogue, their [N, 1, *S] values broadcast back
        whole = self.g.node(conv).attrs["groups"] == 1 and grp.domain[1] <= 256
        per_pixel = (grp.domain[0], 1) + tuple(grp.domain[2:])
        for m in self.g.nodes[self.g.position[conv] + 1:]:
            if m.name in self.group_of or m.name in self.o.cuts or m.name in self.o.torch_nodes or m.shape is None:
                continue
            refs = m.refs()
            reads = any(r in derived for r in refs)
            if m.kind == "reduce":
                src = m.args[0].name if isinstance(m.args[0], Ref) else None
                if whole and src in derived and self.g.node(src).shape == grp.domain \
                        and tuple(m.attrs["dims"]) == (1,) and m.attrs["keepdim"] \
                        and m.op in ("sum", "mean", "amax", "amin") and m.attrs.get("correction") is None:
                    members.add(m.name)
                    derived.add(m.name)
                    order.append(m.name)
                continue
            if m.kind != "pw":
                continue
            shape_ok = m.shape == grp.domain or (whole and m.shape == per_pixel)
            if (not shape_ok if reads else not _broadcasts(m.shape, grp.domain)) \
                    or any(isinstance(a, Sym) for a in m.args):
                continue
            mk, mlate = {}, set()
            for r in refs:
                if r in members:
                    continue
                src = self.g.node(r)
                if src.shape is None or not _broadcasts(src.shape, grp.domain) or src.dtype not in FLOAT_DTYPES:
                    break
                if src.kind not in ("input", "param") and r not in self.group_of:
                    if not param_view(r):
                        break
                    mlate.add(r)
                mk[r] = "tensor"
            else:
                if not reads and not refs:
                    continue
                members.add(m.name)
                if reads:
                    derived.add(m.name)
                order.append(m.name)
                kinds.update(mk)
                late |= mlate
        users = self.g.users
        for tail in reversed(order):
            if tail not in derived or self.g.node(tail).dtype not in FLOAT_DTYPES \
                    or self.g.node(tail).shape not in (grp.domain, per_pixel if whole else grp.domain):
                continue
            anc, todo = set(), [tail]
            while todo:
                v = todo.pop()
                if v in anc or v not in members:
                    continue
                anc.add(v)
                todo.extend(self.g.node(v).refs())
            if all(v == tail or (v not in self.outputs and all(u in anc for u in users[v])) for v in anc):
                break
        for name in order[1:]:
            if name in anc:
                node = self.g.node(name)
                grp.epilogue.append(name)
                grp.operand_kinds.update({r: kinds[r] for r in node.refs() if r in kinds})
                self.add(grp, node)
        # views of parameters that run (as torch groups) after this group was made: finish() orders them first
        grp.__dict__["late_operands"] = sorted(r for r in late if r in grp.operand_kinds)
        # a sum/mean/max/min over every spatial dim (global pooling) read from the tail alone: the kernel
        # reduces its tiles and the full-size output is never stored
        tail = grp.tail
        red = self.g.node(users[tail][0]) if len(users[tail]) == 1 and self.g.node(tail).shape == grp.domain else None
        spatial = tuple(range(2, len(grp.domain)))
        # or over the channels, when they all fit one tile and are not split into groups
        channel = self.g.node(conv).attrs["groups"] == 1 and grp.domain[1] <= 256
        if red is not None and red.kind == "reduce" and red.op in ("sum", "mean", "amax", "amin") \
                and (tuple(red.attrs["dims"]) == spatial or channel and tuple(red.attrs["dims"]) == (1,)) \
                and red.attrs.get("correction") is None \
                and tail not in self.outputs and red.name not in self.o.cuts and red.name not in self.o.torch_nodes \
                and grp.id not in self.o.no_row_fusion and red.dtype in FLOAT_DTYPES:
            grp.row_reduction, grp.row_block = red.op, [red.name]
            self.add(grp, red)

    # -- main -------------------------------------------------------------------------------------
    def run(self) -> list[Group]:
        for n in self.g.nodes:
            if n.kind in ("input", "param"):
                continue
            if n.name in self.o.torch_nodes or n.kind in ("view", "opaque", "getitem"):
                self.new("torch", n, closed=True)
                continue
            if n.name in self.group_of:  # absorbed with its row block
                continue
            if n.kind == "special":  # a template of its own (special.py): one node, one kernel
                self.new("special", n, closed=True)
                continue
            if n.kind == "conv":
                if n.name in self.o.library_gemm or "*" in self.o.library_gemm:
                    self.new("torch", n, closed=True)
                else:
                    self.take_conv_epilogue(self.new("conv", n, domain=n.shape, gemm=n.name, closed=True))
                continue
            if n.kind == "gemm":
                if n.name in self.o.library_gemm or "*" in self.o.library_gemm:
                    self.new("torch", n, closed=True)
                else:
                    self.new("gemm", n, domain=n.shape, gemm=n.name)
                continue
            joined = False
            if n.name not in self.o.cuts:
                producers = []
                for r in n.refs():
                    grp = self.group_of.get(r)
                    if grp is not None and grp not in producers and grp.kind != "torch":
                        producers.append(grp)
                producers.sort(key=lambda grp: -self.start[grp.id])
                # siblings: groups that already read one of n's inputs (horizontal fusion saves a read)
                for r in n.refs():
                    for u in self.g.users[r]:
                        grp = self.group_of.get(u)
                        if grp is not None and grp not in producers and grp.kind in ("pointwise", "rows") \
                                and r not in grp.nodes:
                            producers.append(grp)
                for grp in producers:
                    if self.try_join(grp, n):
                        joined = True
                        break
            if joined:
                continue
            if n.kind == "pw":
                self.new("pointwise", n, domain=n.shape)
            elif n.kind == "reduce":
                src = self.g.node(n.args[0].name)
                if reduce_runs_ok(src.shape, tuple(n.attrs["dims"])):
                    self.new("rows", n, domain=src.shape, red_dims=tuple(n.attrs["dims"]))
                else:
                    self.new("torch", n, closed=True)
            else:
                self.new("torch", n, closed=True)
        self.finish()
        return self.groups

    def absorb_prologues(self) -> None:
        """A pointwise group over a smaller shape (per-channel scale of a batch norm, an activation
        of a bias) whose values only one bigger pointwise group reads is recomputed inside it."""
        changed = True
        while changed:
            changed = False
            for p in list(self.groups):
                if p.kind != "pointwise":
                    continue
                users = {self.group_of[u].id for n in p.nodes for u in self.g.users[n] if self.group_of[u] is not p}
                if len(users) != 1 or any(n in self.outputs for n in p.nodes):
                    continue
                grp = next(g for g in self.groups if g.id in users)
                if grp.kind != "pointwise" or not _broadcasts(p.domain, grp.domain):
                    continue
                grp.nodes = p.nodes + grp.nodes
                for n in p.nodes:
                    self.group_of[n] = grp
                self.deps[grp.id] = (self.deps.get(grp.id, set()) | self.deps.pop(p.id, set())) - {p.id, grp.id}
                self.groups.remove(p)
                changed = True

    def finish(self) -> None:
        for grp in self.groups:
            for r in grp.__dict__.get("late_operands", ()):
                self.deps.setdefault(grp.id, set()).add(self.group_of[r].id)
        self.absorb_prologues()
        sym_users = {}
        for n in self.g.nodes:
            for r in n.refs():
                sym_users.setdefault(r, set()).add(n.name)
        for grp in self.groups:
            members = set(grp.nodes)
            ins: list[str] = []
            outs: list[str] = []
            for name in grp.nodes:
                for r in self.g.node(name).refs():
                    if r not in members and r not in ins:
                        ins.append(r)
                users = sym_users.get(name, set())
                if name in self.outputs or any(u not in members for u in users):
                    outs.append(name)
            grp.inputs, grp.outputs = ins, outs
            if grp.kind in ("gemm", "conv") and grp.outputs != [grp.tail]:
                raise AssertionError(f"{grp.id}: a {grp.kind} group must have one output, its tail ({grp.outputs})")


def _split_norm_cuts(graph: Graph, groups: list[Group]) -> tuple[set[str], set[str]]:
    """(cuts, the nodes of the groups they cut) for rows groups of few long rows that cannot split because a pw node
    reads one of their reductions (a training BatchNorm: the mean, then the variance of ``x - mean``, then the
    normalised tensor, in one program per channel, 64 rows of 2^24 on KernelBench 33; a Frobenius norm divides the
    whole tensor by it, one row of 2^30 on KernelBench 37, modelled at 114 ms against 6.5 cut): every such pw node
    starts a group of its own, so that each level becomes a split reduction (``codegen.auto_split_r``) and the
    normalisation a pointwise pass (``decompose.batch_norm_train`` computes its ``x - mean`` again for it)."""
    from .codegen import few_long_rows
    from .kernels.loopgen import split_reduction_ok

    cuts: set[str] = set()
    cut_nodes: set[str] = set()
    for grp in groups:
        if not few_long_rows(grp):
            continue
        reds = {n for n in grp.nodes if graph.node(n).kind == "reduce"}
        mine = {n for n in grp.nodes if graph.node(n).kind == "pw" and any(x in reds for x in graph.node(n).refs())}
        if mine and not split_reduction_ok(graph, grp):
            cuts |= mine
            cut_nodes |= set(grp.nodes)
    return cuts, cut_nodes


def partition(graph: Graph, options: Options | None = None) -> list[Group]:
    """Fusion groups of ``graph`` in execution order. Where rows groups of few long rows cannot split because
    something in them reads their reduction they are cut (``_split_norm_cuts``), if every rows group the cuts make
    is then a split reduction."""
    options = options or Options()
    p = _Partitioner(graph, options)
    groups = p.run()
    cuts, cut_nodes = _split_norm_cuts(graph, groups)
    if cuts - options.cuts:
        from .kernels.loopgen import split_reduction_ok

        p2 = _Partitioner(graph, Options(cuts=options.cuts | cuts, torch_nodes=options.torch_nodes,
                                         no_row_fusion=options.no_row_fusion, library_gemm=options.library_gemm))
        groups2 = p2.run()
        if all(split_reduction_ok(graph, g) for g in groups2 if g.kind == "rows" and cut_nodes & set(g.nodes)):
            p, groups = p2, groups2
    # run order: a group after every group it reads from, else by its first node
    by_id = {g.id: g for g in groups}
    done: set[str] = set()
    order: list[Group] = []
    pending = sorted(groups, key=lambda grp: graph.position[grp.nodes[0]])
    while pending:
        for i, grp in enumerate(pending):
            if all(d in done for d in p.deps.get(grp.id, ()) if d != grp.id and d in by_id):
                order.append(grp)
                done.add(grp.id)
                del pending[i]
                break
        else:  # pragma: no cover - the join rule forbids cycles
            raise AssertionError("fusion groups depend on each other in a cycle")
    return order


_ = Ref
