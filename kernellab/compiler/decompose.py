"""The node emitter of one lowering (``Ctx``) and the expansions of high-level ops into ``pw``/``reduce``/``gemm``
nodes (softmax, logsumexp, the norms, BatchNorm in eval and training, var/std, GEMMs with bias and scale), which
compute in fp32 as PyTorch does internally. ``lowering.py`` registers which ATen op expands how."""

from __future__ import annotations

from typing import Any

from .ir import FLOAT_DTYPES, Graph, Node, Ref, Sym

__all__ = ["Ctx", "broadcast", "reduced", "dims_of", "is_float", "channel_view", "softmax", "logsumexp", "layer_norm",
           "rms_norm", "instance_norm", "group_norm", "affine", "batch_norm_eval", "batch_norm_train", "var", "gemm"]


class Ctx:
    """Creates the nodes of one expansion; names derive from the ATen node's name."""

    def __init__(self, node: Node, graph: Graph):
        self.node, self.graph, self.out = node, graph, []
        self.n = 0
        self.origin = f"{node.op.split('.')[0]}:{node.name}"

    def _find(self, name: str) -> Node:
        for m in self.out:
            if m.name == name:
                return m
        return self.graph.by_name[name]

    def shape(self, a: Any) -> tuple[int, ...] | None:
        return self._find(a.name).shape if isinstance(a, Ref) else ()

    def dtype(self, a: Any) -> str | None:
        return self._find(a.name).dtype if isinstance(a, Ref) else None

    def emit(self, kind: str, op: str, args: tuple, shape: tuple | None, dtype: str | None,
             attrs: dict | None = None, final: bool = False, name: str | None = None) -> Ref:
        if name is None:
            self.n += 1
            name = self.node.name if final else f"{self.node.name}_{op.split('.')[0]}{self.n}"
        self.out.append(Node(name, kind, op, tuple(args), attrs or {}, shape, dtype, self.origin))
        return Ref(name)

    def pw(self, op: str, *args: Any, final: bool = False, shape=None, **attrs: Any) -> Ref:
        shape = shape if shape is not None else broadcast(*[self.shape(a) for a in args])
        dtype = self.node.dtype if final else "float32"
        if op in ("eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or"):
            dtype = "bool"
        return self.emit("pw", op, args, shape, dtype, attrs, final)

    def reduce(self, op: str, x: Ref, dims: tuple[int, ...], keepdim: bool, final: bool = False,
               **attrs: Any) -> Ref:
        shape = reduced(self.shape(x), dims, keepdim)
        dtype = self.node.dtype if final else "float32"
        return self.emit("reduce", op, (x,), shape, dtype, {"dims": dims, "keepdim": keepdim, **attrs}, final)

    def view(self, x: Ref, shape_arg: list, shape: tuple[int, ...], final: bool = False) -> Ref:
        return self.emit("view", "view.default", (x, list(shape_arg)), shape, self.dtype(x) if not final
                         else self.node.dtype, {}, final)


def broadcast(*shapes: tuple | None) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes if s is not None), default=0)
    out = [1] * nd
    for s in shapes:
        if s is None:
            continue
        for i, d in enumerate(s):
            j = nd - len(s) + i
            out[j] = d if out[j] == 1 else out[j]
    return tuple(out)


def reduced(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def dims_of(dim: Any, nd: int) -> tuple[int, ...]:
    if dim is None or dim == [] or dim == ():
        return tuple(range(nd))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({d % nd if nd else 0 for d in dim}))


def is_float(dtype: str | None) -> bool:
    return dtype in FLOAT_DTYPES


# -- expansions -----------------------------------------------------------------------------------

def softmax(c: Ctx, b: dict, log: bool) -> None:
    x = b["self"]
    d = dims_of(b["dim"], len(c.shape(x)))
    m = c.reduce("amax", x, d, True)
    t = c.pw("sub", x, m)
    e = c.pw("exp", t)
    s = c.reduce("sum", e, d, True)
    if log:
        c.pw("sub", t, c.pw("log", s), final=True)
    else:
        c.pw("div", e, s, final=True)


def logsumexp(c: Ctx, b: dict) -> None:
    x = b["self"]
    d = dims_of(b["dim"], len(c.shape(x)))
    m = c.reduce("amax", x, d, True)
    # rows that are all -inf (or hold +inf) give m = +-inf and x - m = nan: PyTorch shifts by 0 there
    m = c.pw("where", c.pw("eq", c.pw("abs", m), float("inf")), 0.0, m)
    s = c.reduce("sum", c.pw("exp", c.pw("sub", x, m)), d, True)
    r = c.pw("add", c.pw("log", s), m)
    if b["keepdim"]:
        c.pw("identity", r, final=True)
    else:
        c.emit("reduce", "sum", (r,), reduced(c.shape(r), d, False), c.node.dtype,
               {"dims": d, "keepdim": False}, final=True)  # sum over size-1 dims = squeeze


def _norm_tail(c: Ctx, xc: Ref, inv: Ref, w: Any, bias: Any) -> None:
    y = c.pw("mul", xc, inv)
    if w is not None and bias is not None:
        c.pw("add", c.pw("mul", y, w), bias, final=True)
    elif w is not None:
        c.pw("mul", y, w, final=True)
    elif bias is not None:
        c.pw("add", y, bias, final=True)
    else:
        c.pw("identity", y, final=True)


def layer_norm(c: Ctx, b: dict) -> None:
    x = b["input"]
    nd = len(c.shape(x))
    d = tuple(range(nd - len(b["normalized_shape"]), nd))
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    var = c.reduce("mean", c.pw("mul", xc, xc), d, True)
    inv = c.pw("rsqrt", c.pw("add", var, float(b["eps"])))
    _norm_tail(c, xc, inv, b["weight"], b["bias"])


def rms_norm(c: Ctx, b: dict) -> None:
    x = b["input"]
    nd = len(c.shape(x))
    d = tuple(range(nd - len(b["normalized_shape"]), nd))
    eps = b["eps"]
    if eps is None:
        import torch
        eps = torch.finfo(getattr(torch, c.dtype(x))).eps
    ms = c.reduce("mean", c.pw("mul", x, x), d, True)
    inv = c.pw("rsqrt", c.pw("add", ms, float(eps)))
    _norm_tail(c, x, inv, b["weight"], None)


def channel_view(c: Ctx, p: Any, nd: int) -> Any:
    """A per-channel [C] parameter viewed as [C, 1, ..., 1] to broadcast over [N, C, *]."""
    if p is None:
        return None
    ch = c.shape(p)[0]
    return c.view(p, [-1] + [1] * (nd - 2), (ch,) + (1,) * (nd - 2))


def instance_norm(c: Ctx, b: dict) -> None:
    x = b["input"]
    nd = len(c.shape(x))
    if not b["use_input_stats"]:
        return batch_norm_eval(c, x, b["weight"], b["bias"], b["running_mean"], b["running_var"], b["eps"])
    d = tuple(range(2, nd))
    # views first: a value made after a group has started cannot join it (see partition.py)
    w, bias = channel_view(c, b["weight"], nd), channel_view(c, b["bias"], nd)
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    var = c.reduce("mean", c.pw("mul", xc, xc), d, True)
    inv = c.pw("rsqrt", c.pw("add", var, float(b["eps"])))
    _norm_tail(c, xc, inv, w, bias)


def group_norm(c: Ctx, b: dict) -> None:
    x = b["input"]
    shape = c.shape(x)
    g_arg = b["num_groups"]  # an int, or a Dyn read at run time (``self.gn.num_groups``)
    nd, g = len(shape), int(g_arg)
    n, ch = shape[0], shape[1]
    spatial = 1
    for s in shape[2:]:
        spatial *= s
    grouped = (n, g, ch // g, spatial)
    w, bias = b["weight"], b["bias"]
    if w is not None:
        w = c.view(w, [1, g_arg, -1, 1], (1, g, ch // g, 1))
    if bias is not None:
        bias = c.view(bias, [1, g_arg, -1, 1], (1, g, ch // g, 1))
    xv = c.view(x, [Sym(x.name, (0,)), g_arg, -1, Sym(x.name, tuple(range(2, nd)))], grouped)
    d = (2, 3)
    mean = c.reduce("mean", xv, d, True)
    xc = c.pw("sub", xv, mean)
    var = c.reduce("mean", c.pw("mul", xc, xc), d, True)
    inv = c.pw("rsqrt", c.pw("add", var, float(b["eps"])))
    y = affine(c, c.pw("mul", xc, inv), w, bias)
    y = c.pw("cast", y, dtype=c.node.dtype, shape=grouped)
    c.out[-1].dtype = c.node.dtype
    c.view(y, [Sym(x.name, (i,)) for i in range(nd)], shape, final=True)


def affine(c: Ctx, y: Ref, w: Any, bias: Any) -> Ref:
    """A normalization's scale and shift, where the module has them."""
    if w is not None:
        y = c.pw("mul", y, w)
    if bias is not None:
        y = c.pw("add", y, bias)
    return y


def batch_norm_eval(c: Ctx, x: Ref, w: Any, bias: Any, rm: Any, rv: Any, eps: float,
                     name: str | None = None) -> None:
    nd = len(c.shape(x))
    rv, rm = channel_view(c, rv, nd), channel_view(c, rm, nd)
    w, bias = channel_view(c, w, nd), channel_view(c, bias, nd)
    xc = c.pw("sub", x, rm)
    inv = c.pw("rsqrt", c.pw("add", rv, float(eps)))
    affine(c, c.pw("mul", xc, inv), w, bias)
    c.out[-1].name = name or c.node.name
    c.out[-1].dtype = c.node.dtype if name is None else c.dtype(x)


def batch_norm_train(c: Ctx, b: dict) -> None:
    """Training-mode BatchNorm (``_native_batch_norm_legit_functional``): normalize with the batch's
    mean and biased variance over every dim but the channels; the new running statistics are
    ``(1 - momentum) * running + momentum * batch`` with the *unbiased* variance, as PyTorch updates
    them. Outputs ``<node>_out``, ``<node>_rmean``, ``<node>_rvar`` (read by the getitems 0, 3, 4)."""
    x, rm, rv = b["input"], b["running_mean"], b["running_var"]
    nd = len(c.shape(x))
    ch = c.shape(x)[1]
    d = (0,) + tuple(range(2, nd))
    w, bias = channel_view(c, b["weight"], nd), channel_view(c, b["bias"], nd)
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    sq = c.pw("mul", xc, xc)
    var = c.reduce("mean", sq, d, True)
    inv = c.pw("rsqrt", c.pw("add", var, float(b["eps"])))
    # the normalisation computes x - mean again rather than reading the statistics' own: with few channels
    # (64 rows of 2^24 on KernelBench 33) the partitioner then cuts the statistics into split reductions and the
    # normalisation into a pointwise pass (``partition``), none of which writes a full-size x - mean
    affine(c, c.pw("mul", c.pw("sub", x, mean), inv), w, bias)
    c.out[-1].name, c.out[-1].dtype = f"{c.node.name}_out", c.dtype(x)
    m = float(b["momentum"])
    var_u = c.reduce("mean", sq, d, True, correction=1.0)
    for run, batch, tail in ((rm, mean, "rmean"), (rv, var_u, "rvar")):
        flat = c.view(batch, [-1], (ch,))
        c.pw("add", c.pw("mul", run, 1.0 - m), c.pw("mul", flat, m))
        c.out[-1].name, c.out[-1].dtype = f"{c.node.name}_{tail}", c.dtype(run)


def var(c: Ctx, b: dict, std: bool) -> None:
    x = b["self"]
    d = dims_of(b["dim"], len(c.shape(x)))
    corr = b.get("correction")
    if "unbiased" in b:
        corr = 1 if b["unbiased"] else 0
    corr = 1 if corr is None else corr
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    v = c.reduce("mean", c.pw("mul", xc, xc), d, bool(b["keepdim"]), final=not std, correction=float(corr))
    if std:
        c.pw("sqrt", v, final=True)


def gemm(c: Ctx, op: str, a: Ref, bm: Ref, shape: tuple, bias: Any = None, alpha: float = 1.0,
          beta: float = 1.0) -> None:
    if bias is None and alpha == 1.0:
        c.emit("gemm", op, (a, bm), shape, c.node.dtype, final=True)
        return
    # bias (addmm, linear): the reference adds it in fp32 before its one rounding, so the bare
    # product stays fp32; alpha alone scales a product PyTorch also keeps unrounded
    y = c.emit("gemm", op, (a, bm), shape, "float32")
    if alpha != 1.0:
        y = c.pw("mul", y, float(alpha), final=bias is None, shape=shape)
    if bias is not None:
        if beta != 1.0:
            bias = c.pw("mul", bias, float(beta))
        c.pw("add", y, bias, final=True, shape=shape)
