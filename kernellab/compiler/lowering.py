"""ATen call -> builtin IR nodes. High-level ops (softmax, layer_norm, var, batch_norm in eval...)
expand into ``pw``/``reduce`` nodes that compute in fp32 (as PyTorch does internally) and share an
``origin`` tag; GEMMs become bias-free ``gemm`` nodes followed by ``pw`` adds, so that bias, scale
and activation all reach the partitioner as one epilogue chain. Anything else stays an ATen call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .ir import FLOAT_DTYPES, Graph, Node, Ref, Sym

__all__ = ["lower_node", "VIEW_OPS"]

VIEW_OPS = frozenset({
    "view.default", "reshape.default", "_unsafe_view.default", "unsqueeze.default", "squeeze.dim",
    "squeeze.dims", "squeeze.default", "permute.default", "transpose.int", "t.default", "expand.default",
    "flatten.using_ints", "unflatten.int", "slice.Tensor", "select.int", "alias.default", "split.Tensor",
    "split_with_sizes.default", "chunk.default", "unbind.int", "narrow.default", "detach.default",
    "as_strided.default", "view_as.default", "expand_as.default",
})

_UNARY = {
    "neg.default": "neg", "abs.default": "abs", "exp.default": "exp", "exp2.default": "exp2",
    "log.default": "log", "log2.default": "log2", "log1p.default": "log1p", "sqrt.default": "sqrt",
    "rsqrt.default": "rsqrt", "reciprocal.default": "reciprocal", "relu.default": "relu",
    "sigmoid.default": "sigmoid", "tanh.default": "tanh", "erf.default": "erf", "sin.default": "sin",
    "cos.default": "cos", "floor.default": "floor", "ceil.default": "ceil", "sign.default": "sign",
    "silu.default": "silu", "mish.default": "mish", "hardsigmoid.default": "hardsigmoid",
    "hardswish.default": "hardswish", "selu.default": "selu", "logical_not.default": "logical_not",
    "clone.default": "identity", "lift_fresh_copy.default": "identity", "square.default": "square",
    "relu6.default": "relu6",
    # a copy into a fresh contiguous tensor: as a pointwise identity it is a kernel of ours (a tiled
    # one when the source is transposed, see loopgen.py) and it fuses with the ops around it
    "contiguous.default": "identity",
}
_BINARY = {
    "mul.Tensor": "mul", "mul.Scalar": "mul", "div.Tensor": "div", "div.Scalar": "div",
    "maximum.default": "maximum", "minimum.default": "minimum", "eq.Tensor": "eq", "eq.Scalar": "eq",
    "ne.Tensor": "ne", "ne.Scalar": "ne", "lt.Tensor": "lt", "lt.Scalar": "lt", "le.Tensor": "le",
    "le.Scalar": "le", "gt.Tensor": "gt", "gt.Scalar": "gt", "ge.Tensor": "ge", "ge.Scalar": "ge",
    "logical_and.default": "logical_and", "logical_or.default": "logical_or",
    "pow.Tensor_Scalar": "pow", "pow.Tensor_Tensor": "pow", "pow.Scalar": "pow",
}


class _Ctx:
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
        shape = shape if shape is not None else _broadcast(*[self.shape(a) for a in args])
        dtype = self.node.dtype if final else "float32"
        if op in ("eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or"):
            dtype = "bool"
        return self.emit("pw", op, args, shape, dtype, attrs, final)

    def reduce(self, op: str, x: Ref, dims: tuple[int, ...], keepdim: bool, final: bool = False,
               **attrs: Any) -> Ref:
        shape = _reduced(self.shape(x), dims, keepdim)
        dtype = self.node.dtype if final else "float32"
        return self.emit("reduce", op, (x,), shape, dtype, {"dims": dims, "keepdim": keepdim, **attrs}, final)

    def view(self, x: Ref, shape_arg: list, shape: tuple[int, ...], final: bool = False) -> Ref:
        return self.emit("view", "view.default", (x, list(shape_arg)), shape, self.dtype(x) if not final
                         else self.node.dtype, {}, final)


def _broadcast(*shapes: tuple | None) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes if s is not None), default=0)
    out = [1] * nd
    for s in shapes:
        if s is None:
            continue
        for i, d in enumerate(s):
            j = nd - len(s) + i
            out[j] = d if out[j] == 1 else out[j]
    return tuple(out)


def _reduced(shape: tuple[int, ...], dims: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    if keepdim:
        return tuple(1 if i in dims else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in dims)


def _dims(dim: Any, nd: int) -> tuple[int, ...]:
    if dim is None or dim == [] or dim == ():
        return tuple(range(nd))
    if isinstance(dim, int):
        dim = [dim]
    return tuple(sorted({d % nd if nd else 0 for d in dim}))


def _is_float(dtype: str | None) -> bool:
    return dtype in FLOAT_DTYPES


# -- expansions -----------------------------------------------------------------------------------

def _softmax(c: _Ctx, b: dict, log: bool) -> None:
    x = b["self"]
    d = _dims(b["dim"], len(c.shape(x)))
    m = c.reduce("amax", x, d, True)
    t = c.pw("sub", x, m)
    e = c.pw("exp", t)
    s = c.reduce("sum", e, d, True)
    if log:
        c.pw("sub", t, c.pw("log", s), final=True)
    else:
        c.pw("div", e, s, final=True)


def _logsumexp(c: _Ctx, b: dict) -> None:
    x = b["self"]
    d = _dims(b["dim"], len(c.shape(x)))
    m = c.reduce("amax", x, d, True)
    # rows that are all -inf (or hold +inf) give m = +-inf and x - m = nan: PyTorch shifts by 0 there
    m = c.pw("where", c.pw("eq", c.pw("abs", m), float("inf")), 0.0, m)
    s = c.reduce("sum", c.pw("exp", c.pw("sub", x, m)), d, True)
    r = c.pw("add", c.pw("log", s), m)
    if b["keepdim"]:
        c.pw("identity", r, final=True)
    else:
        c.emit("reduce", "sum", (r,), _reduced(c.shape(r), d, False), c.node.dtype,
               {"dims": d, "keepdim": False}, final=True)  # sum over size-1 dims = squeeze


def _norm_tail(c: _Ctx, xc: Ref, inv: Ref, w: Any, bias: Any) -> None:
    y = c.pw("mul", xc, inv)
    if w is not None and bias is not None:
        c.pw("add", c.pw("mul", y, w), bias, final=True)
    elif w is not None:
        c.pw("mul", y, w, final=True)
    elif bias is not None:
        c.pw("add", y, bias, final=True)
    else:
        c.pw("identity", y, final=True)


def _layer_norm(c: _Ctx, b: dict) -> None:
    x = b["input"]
    nd = len(c.shape(x))
    d = tuple(range(nd - len(b["normalized_shape"]), nd))
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    var = c.reduce("mean", c.pw("mul", xc, xc), d, True)
    inv = c.pw("rsqrt", c.pw("add", var, float(b["eps"])))
    _norm_tail(c, xc, inv, b["weight"], b["bias"])


def _rms_norm(c: _Ctx, b: dict) -> None:
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


def _channel_view(c: _Ctx, p: Any, nd: int) -> Any:
    """A per-channel [C] parameter viewed as [C, 1, ..., 1] to broadcast over [N, C, *]."""
    if p is None:
        return None
    ch = c.shape(p)[0]
    return c.view(p, [-1] + [1] * (nd - 2), (ch,) + (1,) * (nd - 2))


def _instance_norm(c: _Ctx, b: dict) -> None:
    x = b["input"]
    nd = len(c.shape(x))
    if not b["use_input_stats"]:
        return _batch_norm_eval(c, x, b["weight"], b["bias"], b["running_mean"], b["running_var"], b["eps"])
    d = tuple(range(2, nd))
    # views first: a value made after a group has started cannot join it (see partition.py)
    w, bias = _channel_view(c, b["weight"], nd), _channel_view(c, b["bias"], nd)
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    var = c.reduce("mean", c.pw("mul", xc, xc), d, True)
    inv = c.pw("rsqrt", c.pw("add", var, float(b["eps"])))
    _norm_tail(c, xc, inv, w, bias)


def _group_norm(c: _Ctx, b: dict) -> None:
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
    y = _affine(c, c.pw("mul", xc, inv), w, bias)
    y = c.pw("cast", y, dtype=c.node.dtype, shape=grouped)
    c.out[-1].dtype = c.node.dtype
    c.view(y, [Sym(x.name, (i,)) for i in range(nd)], shape, final=True)


def _affine(c: _Ctx, y: Ref, w: Any, bias: Any) -> Ref:
    """A normalization's scale and shift, where the module has them."""
    if w is not None:
        y = c.pw("mul", y, w)
    if bias is not None:
        y = c.pw("add", y, bias)
    return y


def _batch_norm_eval(c: _Ctx, x: Ref, w: Any, bias: Any, rm: Any, rv: Any, eps: float,
                     name: str | None = None) -> None:
    nd = len(c.shape(x))
    rv, rm = _channel_view(c, rv, nd), _channel_view(c, rm, nd)
    w, bias = _channel_view(c, w, nd), _channel_view(c, bias, nd)
    xc = c.pw("sub", x, rm)
    inv = c.pw("rsqrt", c.pw("add", rv, float(eps)))
    _affine(c, c.pw("mul", xc, inv), w, bias)
    c.out[-1].name = name or c.node.name
    c.out[-1].dtype = c.node.dtype if name is None else c.dtype(x)


def _batch_norm_train(c: _Ctx, b: dict) -> None:
    """Training-mode BatchNorm (``_native_batch_norm_legit_functional``): normalize with the batch's
    mean and biased variance over every dim but the channels; the new running statistics are
    ``(1 - momentum) * running + momentum * batch`` with the *unbiased* variance, as PyTorch updates
    them. Outputs ``<node>_out``, ``<node>_rmean``, ``<node>_rvar`` (read by the getitems 0, 3, 4)."""
    x, rm, rv = b["input"], b["running_mean"], b["running_var"]
    nd = len(c.shape(x))
    ch = c.shape(x)[1]
    d = (0,) + tuple(range(2, nd))
    w, bias = _channel_view(c, b["weight"], nd), _channel_view(c, b["bias"], nd)
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    sq = c.pw("mul", xc, xc)
    var = c.reduce("mean", sq, d, True)
    inv = c.pw("rsqrt", c.pw("add", var, float(b["eps"])))
    _affine(c, c.pw("mul", xc, inv), w, bias)
    c.out[-1].name, c.out[-1].dtype = f"{c.node.name}_out", c.dtype(x)
    m = float(b["momentum"])
    var_u = c.reduce("mean", sq, d, True, correction=1.0)
    for run, batch, tail in ((rm, mean, "rmean"), (rv, var_u, "rvar")):
        flat = c.view(batch, [-1], (ch,))
        c.pw("add", c.pw("mul", run, 1.0 - m), c.pw("mul", flat, m))
        c.out[-1].name, c.out[-1].dtype = f"{c.node.name}_{tail}", c.dtype(run)


def _var(c: _Ctx, b: dict, std: bool) -> None:
    x = b["self"]
    d = _dims(b["dim"], len(c.shape(x)))
    corr = b.get("correction")
    if "unbiased" in b:
        corr = 1 if b["unbiased"] else 0
    corr = 1 if corr is None else corr
    mean = c.reduce("mean", x, d, True)
    xc = c.pw("sub", x, mean)
    v = c.reduce("mean", c.pw("mul", xc, xc), d, bool(b["keepdim"]), final=not std, correction=float(corr))
    if std:
        c.pw("sqrt", v, final=True)


def _gemm(c: _Ctx, op: str, a: Ref, bm: Ref, shape: tuple, bias: Any = None, alpha: float = 1.0,
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


def _lower_aten(c: _Ctx) -> bool:
    """Emit the expansion of ``c.node`` into ``c.out``; False when it stays an ATen call."""
    n, b = c.node, c.node.attrs["bound"]
    op = n.op
    if op in _UNARY:
        if op == "relu6.default":
            c.pw("hardtanh", b["self"], final=True, lo=0.0, hi=6.0)
        else:
            c.pw(_UNARY[op], b["self"], final=True)
        return True
    if op in _BINARY:
        args = list(n.attrs["args"])[:2]
        c.pw(_BINARY[op], *args, final=True)
        return True
    if op in ("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Scalar", "rsub.Tensor"):
        x, y = b["self"], b["other"]
        alpha = b.get("alpha", 1)
        if op.startswith("rsub"):
            x, y = y, x  # rsub(self, other) = other - alpha * self
            if alpha != 1:
                y = c.pw("mul", y, alpha)
        elif alpha != 1:
            y = c.pw("mul", y, alpha) if isinstance(y, Ref) else y * alpha
        c.pw("sub" if op.startswith(("sub", "rsub")) else "add", x, y, final=True)
        return True
    if op == "div.Tensor_mode":
        if b["rounding_mode"] is None:
            c.pw("div", b["self"], b["other"], final=True)
            return True
        if b["rounding_mode"] == "floor" and _is_float(n.dtype):
            c.pw("floor", c.pw("div", b["self"], b["other"]), final=True)
            return True
        return False
    if op == "gelu.default":
        c.pw("gelu", b["self"], final=True, approximate=b["approximate"])
        return True
    if op == "softplus.default":
        c.pw("softplus", b["self"], final=True, beta=float(b["beta"]), threshold=float(b["threshold"]))
        return True
    if op == "elu.default":
        c.pw("elu", b["self"], final=True, alpha=float(b["alpha"]), scale=float(b["scale"]),
             input_scale=float(b["input_scale"]))
        return True
    if op == "leaky_relu.default":
        c.pw("leaky_relu", b["self"], final=True, slope=float(b["negative_slope"]))
        return True
    if op == "hardtanh.default":
        c.pw("hardtanh", b["self"], final=True, lo=float(b["min_val"]), hi=float(b["max_val"]))
        return True
    if op in ("clamp.default", "clamp.Tensor", "clamp_min.default", "clamp_max.default",
              "clamp_min.Tensor", "clamp_max.Tensor"):
        lo, hi = b.get("min"), b.get("max")
        c.pw("clamp", b["self"], lo, hi, final=True)
        return True
    if op in ("where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar"):
        c.pw("where", b["condition"], b["self"], b["other"], final=True)
        return True
    if op in ("to.dtype", "_to_copy.default", "to.dtype_layout", "type_as.default", "to.device"):
        if not _is_float(n.dtype):
            return False
        c.pw("cast", b["self"], final=True, dtype=n.dtype)
        return True
    if op == "dropout.default" and not b["train"]:
        c.pw("identity", b["input"], final=True)
        return True
    if op in ("sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax.default",
              "amin.default", "max.default", "min.default"):
        x = b["self"]
        kind = {"sum": "sum", "mean": "mean", "amax": "amax", "amin": "amin", "max": "amax",
                "min": "amin"}[op.split(".")[0]]
        d = _dims(b.get("dim"), len(c.shape(x)))
        c.reduce(kind, x, d, bool(b.get("keepdim", False)), final=True)
        return True
    if op in ("max.dim", "min.dim"):
        x = b["self"]
        d = _dims(b["dim"], len(c.shape(x)))
        shape = _reduced(c.shape(x), d, bool(b["keepdim"]))
        c.emit("reduce", "amax" if op == "max.dim" else "amin", (x,), shape, c.dtype(x),
               {"dims": d, "keepdim": bool(b["keepdim"])}, name=f"{n.name}_values")
        return False  # the ATen call also stays: it is kept only if the indices are used
    if op in ("softmax.int", "_softmax.default"):
        _softmax(c, b, log=False)
        return True
    if op in ("log_softmax.int", "_log_softmax.default"):
        _softmax(c, b, log=True)
        return True
    if op == "logsumexp.default":
        _logsumexp(c, b)
        return True
    if op == "layer_norm.default":
        _layer_norm(c, b)
        return True
    if op == "rms_norm.default":
        _rms_norm(c, b)
        return True
    if op == "group_norm.default":
        if c.shape(b["input"])[1] % int(b["num_groups"]):
            return False
        _group_norm(c, b)
        return True
    if op == "instance_norm.default":
        _instance_norm(c, b)
        return True
    if op == "batch_norm.default" and not b["training"]:
        _batch_norm_eval(c, b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"], b["eps"])
        return True
    if (op == "_native_batch_norm_legit_functional.default" and b["training"]
            and isinstance(b["momentum"], float) and len(c.shape(b["input"])) >= 2):
        _batch_norm_train(c, b)
        return False  # the ATen call stays for its other results (dead code unless read)
    if op == "_native_batch_norm_legit_no_training.default":
        _batch_norm_eval(c, b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"],
                         b["eps"], name=f"{n.name}_out")
        return False
    if op in ("var.dim", "var.correction", "std.dim", "std.correction"):
        _var(c, b, std=op.startswith("std"))
        return True
    if op == "linear.default":
        _gemm(c, "linear", b["input"], b["weight"], n.shape, bias=b["bias"])
        return True
    if op in ("mm.default", "bmm.default"):
        _gemm(c, op.split(".")[0], b["self"], b["mat2"], n.shape)
        return True
    if op == "addmm.default":
        _gemm(c, "mm", b["mat1"], b["mat2"], n.shape, bias=b["self"], alpha=float(b["alpha"]),
              beta=float(b["beta"]))
        return True
    if op in _CONVS and _is_float(n.dtype) and _conv(c, b):
        return True
    if op in _CONVS and b.get("bias") is not None and _is_float(n.dtype) and len(n.attrs["args"]) > 2:
        # cuDNN adds the bias in a pass of its own; as a pointwise op it fuses with what follows
        nd = len(n.shape)
        bias = _channel_view(c, b["bias"], nd)
        raw = list(n.attrs["args"])
        raw[2] = None
        conv = c.emit("opaque", op, tuple(raw), n.shape, n.dtype, {"kwargs": n.attrs["kwargs"]},
                      name=f"{n.name}_nobias")
        c.pw("add", conv, bias, final=True, shape=n.shape)
        return True
    if op in _SPECIAL:
        return _SPECIAL[op](c, b)
    if op == "matmul.default":
        sa, sb = c.shape(b["self"]), c.shape(b["other"])
        if len(sa) >= 2 and len(sb) == 2:
            _gemm(c, "mm", b["self"], b["other"], n.shape)
            return True
        if len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0]:
            _gemm(c, "bmm", b["self"], b["other"], n.shape)
            return True
        if len(sa) == 4 and len(sb) == 4 and sa[:2] == sb[:2] and _is_float(n.dtype):
            # attention's [B, H, S, E] @ [B, H, E, T]: one bmm over the B*H matrices (reshape, not
            # view: k arrives transposed; merging B and H needs no copy for such strides)
            a, bm = b["self"], b["other"]
            lo = (sa[0] * sa[1],)
            a3 = c.emit("view", "reshape.default", (a, [-1, Sym(a.name, (2,)), Sym(a.name, (3,))]),
                        lo + sa[2:], c.dtype(a))
            b3 = c.emit("view", "reshape.default", (bm, [-1, Sym(bm.name, (2,)), Sym(bm.name, (3,))]),
                        lo + sb[2:], c.dtype(bm))
            y = c.emit("gemm", "bmm", (a3, b3), lo + (sa[2], sb[3]), n.dtype)
            dims = [Sym(a.name, (0,)), Sym(a.name, (1,)), Sym(a.name, (2,)), Sym(bm.name, (3,))]
            c.emit("view", "view.default", (y, dims), n.shape, n.dtype, final=True)
            return True
    return False


_CONVS = ("convolution.default", "conv1d.default", "conv2d.default", "conv3d.default")


def _ints(v: Any, n: int) -> list[int] | None:
    """A conv parameter as ``n`` plain ints (None: a string padding, a size read at run time...)."""
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    if len(v) == 1:
        v = v * n
    if len(v) != n or not all(type(x) is int for x in v):
        return None
    return v


def _conv(c: _Ctx, b: dict) -> bool:
    """A convolution becomes a ``conv`` node (our implicit-GEMM template, ``conv.py``) and its bias a
    pointwise add, so bias, activation, scaling and residual reach the partitioner as one epilogue."""
    n = c.node
    x, w = b.get("input"), b.get("weight")
    if not isinstance(x, Ref) or not isinstance(w, Ref) or n.shape is None:
        return False
    nd = len(n.shape) - 2
    if nd not in (1, 2, 3) or len(c.shape(x) or ()) != nd + 2 or len(c.shape(w) or ()) != nd + 2:
        return False
    if not (_is_float(c.dtype(x)) and c.dtype(x) == c.dtype(w) == n.dtype):
        return False
    transposed = bool(b.get("transposed", False))
    attrs = {"dims": nd, "transposed": transposed}
    for key, default in (("stride", 1), ("padding", 0), ("dilation", 1), ("output_padding", 0)):
        v = _ints(b.get(key, default), nd)
        if v is None:
            return False
        attrs[key] = v
    groups = b.get("groups", 1)
    if type(groups) is not int and not transposed:
        groups = 0  # a size that changes with SMALL (depthwise: groups=channels): from the shapes at run time
    elif type(groups) is not int or groups < 1:
        return False
    attrs["groups"] = groups
    bias = b.get("bias")
    if bias is not None and not isinstance(bias, Ref):
        return False
    # the bias view first: a value made after the conv's group has started cannot join it (partition.py)
    bv = _channel_view(c, bias, nd + 2) if bias is not None else None
    # with a bias the bare product stays fp32, as the reference adds the bias before its one rounding
    conv = c.emit("conv", "conv_transpose" if transposed else "conv", (x, w), n.shape,
                  n.dtype if bias is None else "float32", attrs, final=bias is None)
    if bias is not None:
        c.pw("add", conv, bv, final=True, shape=n.shape)
    return True


# -- ops with a template of their own (``special.py``): one node each, run as one kernel ------------

def _cumsum(c: _Ctx, b: dict) -> bool:
    x = b["self"]
    if not _is_float(c.dtype(x)) or not _is_float(c.node.dtype):
        return False
    nd = len(c.shape(x))
    c.emit("special", "cumsum", (x,), c.node.shape, c.node.dtype, {"dim": int(b["dim"]) % max(nd, 1)}, final=True)
    return True


def _embedding(c: _Ctx, b: dict) -> bool:
    w, ids = b["weight"], b["indices"]
    if not _is_float(c.dtype(w)) or c.dtype(ids) not in ("int64", "int32") or len(c.shape(w)) != 2:
        return False
    c.emit("special", "embedding", (w, ids), c.node.shape, c.node.dtype, {}, final=True)
    return True


def _pair(v: Any, n: int = 2) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * n if len(v) == 1 else v)]


def _max_pool2d(c: _Ctx, b: dict, name: str | None = None, shape: tuple | None = None) -> bool:
    x = b["self"]
    if not _is_float(c.dtype(x)) or len(c.shape(x)) not in (3, 4):
        return False
    k = _pair(b["kernel_size"])
    stride = _pair(b.get("stride") or k)
    attrs = {"kernel": k, "stride": stride, "padding": _pair(b.get("padding", 0)),
             "dilation": _pair(b.get("dilation", 1)), "ceil_mode": bool(b.get("ceil_mode", False))}
    c.emit("special", "max_pool2d", (x,), shape or c.node.shape, c.dtype(x), attrs, final=name is None, name=name)
    return True


_SPECIAL: dict[str, Callable[[_Ctx, dict], bool]] = {
    "cumsum.default": _cumsum,
    "embedding.default": _embedding,
    "max_pool2d.default": _max_pool2d,
}


def _fusible(node: Node, out: list[Node], graph: Graph) -> bool:
    """Kernels compute floating point values (bool masks allowed as inputs); integer math stays ATen."""
    for m in out:
        if m.kind == "special":  # its lowering checked its own operand types
            continue
        if m.kind in ("pw", "reduce", "gemm") and m.dtype not in FLOAT_DTYPES + ("bool",):
            return False
        for r in m.refs():
            dt = graph.by_name[r].dtype if r in graph.by_name else next(
                (o.dtype for o in out if o.name == r), None)
            if dt not in FLOAT_DTYPES + ("bool",):
                return False
    return True


def lower_node(node: Node, graph: Graph) -> list[Node]:
    """The IR nodes that implement one captured node (itself when it is not an ATen call)."""
    if node.kind == "getitem":
        src = graph.by_name[node.args[0].name]
        if node.attrs["index"] == 0 and src.op == "max_pool2d_with_indices.default" and src.kind == "aten":
            # the values alone (the indices are dead code unless something reads them)
            c = _Ctx(src, graph)
            if _max_pool2d(c, src.attrs["bound"], name=node.name, shape=node.shape):
                c.out[-1].dtype = node.dtype
                return c.out
        if node.attrs["index"] == 0 and src.op in ("max.dim", "min.dim", "_native_batch_norm_legit_no_training.default"):
            tail = "_values" if src.op in ("max.dim", "min.dim") else "_out"
            return [Node(node.name, "pw", "identity", (Ref(src.name + tail),), {}, node.shape, node.dtype)]
        tail = {0: "_out", 3: "_rmean", 4: "_rvar"}.get(node.attrs["index"])
        if src.op == "_native_batch_norm_legit_functional.default" and tail and src.attrs.get("expanded"):
            return [Node(node.name, "pw", "identity", (Ref(src.name + tail),), {}, node.shape, node.dtype)]
        return [node]
    if node.kind != "aten":
        return [node]
    c = _Ctx(node, graph)
    whole = False
    try:
        whole = _lower_aten(c)
    except (KeyError, TypeError, IndexError):  # an overload whose schema differs: leave it to ATen
        c.out, whole = [], False
    if c.out and not _fusible(node, c.out, graph):
        c.out, whole = [], False
    if whole:
        return c.out
    # the getitems of a multi-result op read the expansion's named results (see above)
    node.attrs["expanded"] = bool(c.out)
    kind = "view" if node.op in VIEW_OPS else "opaque"
    raw = Node(node.name, kind, node.op, tuple(node.attrs["args"]), {"kwargs": node.attrs["kwargs"]},
               node.shape, node.dtype)
    return c.out + [raw]

