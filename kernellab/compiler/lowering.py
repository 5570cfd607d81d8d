"""ATen call -> builtin IR nodes, one registered lowering per op (``@lowering("relu.default")`` fills
``LOWERINGS``, as torch._inductor's ``register_lowering`` does). High-level ops (softmax, layer_norm, var,
batch_norm in eval...) expand into ``pw``/``reduce`` nodes that compute in fp32 (as PyTorch does internally)
and share an ``origin`` tag; GEMMs become bias-free ``gemm`` nodes followed by ``pw`` adds, so that bias,
scale and activation all reach the partitioner as one epilogue chain. An op without a lowering, or whose
lowering declines it, stays an ATen call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .decompose import (
    Ctx,
    batch_norm_eval,
    batch_norm_train,
    channel_view,
    dims_of,
    gemm,
    group_norm,
    instance_norm,
    is_float,
    layer_norm,
    logsumexp,
    reduced,
    rms_norm,
    softmax,
    var,
)
from .ir import FLOAT_DTYPES, Graph, Node, Ref, Sym

__all__ = ["lower_node", "lowering", "LOWERINGS", "VIEW_OPS"]

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


# -- the registry: one lowering per ATen op --------------------------------------------------------
# A lowering emits the expansion of ``c.node`` (its bound arguments ``b``) into ``c.out`` and says whether the
# expansion replaces the node (True) or the ATen call stays beside it (False: nothing emitted, or a partial
# expansion such as max.dim's values, read by the getitems of a multi-result op). An op with no lowering
# stays an ATen call. Registered once each, by ``@lowering(op, ...)`` (torch._inductor.lowering's
# ``register_lowering``); the op names are the captured overloads (``relu.default``).

Lowering = Callable[[Ctx, dict], bool]
LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of each of ``ops`` (an op has at most one)."""
    def register(fn: Lowering) -> Lowering:
        for op in ops:
            if op in LOWERINGS:
                raise ValueError(f"{op} already lowered by {LOWERINGS[op].__name__}")
            LOWERINGS[op] = fn
        return fn
    return register


def _lower_aten(c: Ctx) -> bool:
    """Emit the expansion of ``c.node`` into ``c.out``; False when it stays an ATen call."""
    fn = LOWERINGS.get(c.node.op)
    return fn(c, c.node.attrs["bound"]) if fn is not None else False


@lowering(*_UNARY)
def _unary(c: Ctx, b: dict) -> bool:
    c.pw(_UNARY[c.node.op], b["self"], final=True)
    return True


@lowering("relu6.default")
def _relu6(c: Ctx, b: dict) -> bool:
    c.pw("hardtanh", b["self"], final=True, lo=0.0, hi=6.0)
    return True


@lowering(*_BINARY)
def _binary(c: Ctx, b: dict) -> bool:
    args = list(c.node.attrs["args"])[:2]
    c.pw(_BINARY[c.node.op], *args, final=True)
    return True


@lowering("add.Tensor", "add.Scalar", "sub.Tensor", "sub.Scalar", "rsub.Scalar", "rsub.Tensor")
def _add_sub(c: Ctx, b: dict) -> bool:
    op = c.node.op
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


@lowering("div.Tensor_mode")
def _div_mode(c: Ctx, b: dict) -> bool:
    if b["rounding_mode"] is None:
        c.pw("div", b["self"], b["other"], final=True)
        return True
    if b["rounding_mode"] == "floor" and is_float(c.node.dtype):
        c.pw("floor", c.pw("div", b["self"], b["other"]), final=True)
        return True
    return False


@lowering("gelu.default")
def _gelu(c: Ctx, b: dict) -> bool:
    c.pw("gelu", b["self"], final=True, approximate=b["approximate"])
    return True


@lowering("softplus.default")
def _softplus(c: Ctx, b: dict) -> bool:
    c.pw("softplus", b["self"], final=True, beta=float(b["beta"]), threshold=float(b["threshold"]))
    return True


@lowering("elu.default")
def _elu(c: Ctx, b: dict) -> bool:
    c.pw("elu", b["self"], final=True, alpha=float(b["alpha"]), scale=float(b["scale"]),
         input_scale=float(b["input_scale"]))
    return True


@lowering("leaky_relu.default")
def _leaky_relu(c: Ctx, b: dict) -> bool:
    c.pw("leaky_relu", b["self"], final=True, slope=float(b["negative_slope"]))
    return True


@lowering("hardtanh.default")
def _hardtanh(c: Ctx, b: dict) -> bool:
    c.pw("hardtanh", b["self"], final=True, lo=float(b["min_val"]), hi=float(b["max_val"]))
    return True


@lowering("clamp.default", "clamp.Tensor", "clamp_min.default", "clamp_max.default", "clamp_min.Tensor",
          "clamp_max.Tensor")
def _clamp(c: Ctx, b: dict) -> bool:
    c.pw("clamp", b["self"], b.get("min"), b.get("max"), final=True)
    return True


@lowering("where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def _where(c: Ctx, b: dict) -> bool:
    c.pw("where", b["condition"], b["self"], b["other"], final=True)
    return True


@lowering("to.dtype", "_to_copy.default", "to.dtype_layout", "type_as.default", "to.device")
def _cast(c: Ctx, b: dict) -> bool:
    if not is_float(c.node.dtype):
        return False
    c.pw("cast", b["self"], final=True, dtype=c.node.dtype)
    return True


@lowering("dropout.default")
def _dropout(c: Ctx, b: dict) -> bool:
    if b["train"]:
        return False  # random numbers: PyTorch draws them
    c.pw("identity", b["input"], final=True)
    return True


_REDUCTIONS = {"sum": "sum", "mean": "mean", "amax": "amax", "amin": "amin", "max": "amax", "min": "amin"}


@lowering("sum.dim_IntList", "sum.default", "mean.dim", "mean.default", "amax.default", "amin.default",
          "max.default", "min.default")
def _reduction(c: Ctx, b: dict) -> bool:
    x = b["self"]
    d = dims_of(b.get("dim"), len(c.shape(x)))
    c.reduce(_REDUCTIONS[c.node.op.split(".")[0]], x, d, bool(b.get("keepdim", False)), final=True)
    return True


@lowering("linalg_vector_norm.default")
def _vector_norm(c: Ctx, b: dict) -> bool:
    """The 1-, 2- and inf-norms (``torch.norm``'s Frobenius and p=2 among them) as a reduction and a pointwise op;
    other orders stay ATen."""
    x, p = b["self"], b.get("ord", 2)
    if b.get("dtype") is not None or p not in (1, 2, float("inf")):
        return False
    d, keep = dims_of(b.get("dim"), len(c.shape(x))), bool(b.get("keepdim", False))
    if p == 2:
        c.pw("sqrt", c.reduce("sum", c.pw("mul", x, x), d, keep), final=True)
    else:
        c.reduce("sum" if p == 1 else "amax", c.pw("abs", x), d, keep, final=True)
    return True


@lowering("argmax.default", "argmin.default")
def _arg_extreme(c: Ctx, b: dict) -> bool:
    x = b["self"]
    if not is_float(c.dtype(x)):
        return False
    dim = b.get("dim")
    attrs = {"mode": c.node.op[3:6], "dim": None if dim is None else int(dim) % max(len(c.shape(x)), 1),
             "keepdim": bool(b.get("keepdim", False))}
    c.emit("special", "arg_extreme", (x,), c.node.shape, "int64", attrs, final=True)
    return True


@lowering("max.dim", "min.dim")
def _max_min_dim(c: Ctx, b: dict) -> bool:
    x = b["self"]
    d = dims_of(b["dim"], len(c.shape(x)))
    shape = reduced(c.shape(x), d, bool(b["keepdim"]))
    c.emit("reduce", "amax" if c.node.op == "max.dim" else "amin", (x,), shape, c.dtype(x),
           {"dims": d, "keepdim": bool(b["keepdim"])}, name=f"{c.node.name}_values")
    return False  # the ATen call also stays: it is kept only if the indices are used


@lowering("softmax.int", "_softmax.default")
def _softmax_op(c: Ctx, b: dict) -> bool:
    softmax(c, b, log=False)
    return True


@lowering("log_softmax.int", "_log_softmax.default")
def _log_softmax_op(c: Ctx, b: dict) -> bool:
    softmax(c, b, log=True)
    return True


def _expansion(op: str, expand: Callable[[Ctx, dict], None]) -> None:
    """``op`` lowered by an expansion that always applies (``decompose``'s, on the op's bound arguments)."""
    def lower(c: Ctx, b: dict) -> bool:
        expand(c, b)
        return True
    lower.__name__ = f"_{expand.__name__}_op"
    lowering(op)(lower)


_expansion("logsumexp.default", logsumexp)
_expansion("layer_norm.default", layer_norm)
_expansion("rms_norm.default", rms_norm)
_expansion("instance_norm.default", instance_norm)


@lowering("group_norm.default")
def _group_norm_op(c: Ctx, b: dict) -> bool:
    if c.shape(b["input"])[1] % int(b["num_groups"]):
        return False
    group_norm(c, b)
    return True


@lowering("batch_norm.default")
def _batch_norm_op(c: Ctx, b: dict) -> bool:
    if b["training"]:
        return False  # training: export gives _native_batch_norm_legit_functional, lowered below
    batch_norm_eval(c, b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"], b["eps"])
    return True


@lowering("_native_batch_norm_legit_functional.default")
def _batch_norm_functional(c: Ctx, b: dict) -> bool:
    if b["training"] and isinstance(b["momentum"], float) and len(c.shape(b["input"])) >= 2:
        batch_norm_train(c, b)
    return False  # the ATen call stays for its other results (dead code unless read)


@lowering("_native_batch_norm_legit_no_training.default")
def _batch_norm_no_training(c: Ctx, b: dict) -> bool:
    batch_norm_eval(c, b["input"], b["weight"], b["bias"], b["running_mean"], b["running_var"],
                     b["eps"], name=f"{c.node.name}_out")
    return False


@lowering("var.dim", "var.correction", "std.dim", "std.correction")
def _var_op(c: Ctx, b: dict) -> bool:
    var(c, b, std=c.node.op.startswith("std"))
    return True


@lowering("linear.default")
def _linear(c: Ctx, b: dict) -> bool:
    gemm(c, "linear", b["input"], b["weight"], c.node.shape, bias=b["bias"])
    return True


@lowering("mm.default", "bmm.default")
def _mm(c: Ctx, b: dict) -> bool:
    gemm(c, c.node.op.split(".")[0], b["self"], b["mat2"], c.node.shape)
    return True


@lowering("addmm.default")
def _addmm(c: Ctx, b: dict) -> bool:
    gemm(c, "mm", b["mat1"], b["mat2"], c.node.shape, bias=b["self"], alpha=float(b["alpha"]),
          beta=float(b["beta"]))
    return True


@lowering("matmul.default")
def _matmul(c: Ctx, b: dict) -> bool:
    n = c.node
    sa, sb = c.shape(b["self"]), c.shape(b["other"])
    if len(sa) >= 2 and len(sb) == 2:
        gemm(c, "mm", b["self"], b["other"], n.shape)
        return True
    if len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0]:
        gemm(c, "bmm", b["self"], b["other"], n.shape)
        return True
    if len(sa) == 4 and len(sb) == 4 and sa[:2] == sb[:2] and is_float(n.dtype):
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


@lowering(*_CONVS)
def _convolution(c: Ctx, b: dict) -> bool:
    n = c.node
    if not is_float(n.dtype):
        return False
    if _conv(c, b):
        return True
    if b.get("bias") is not None and len(n.attrs["args"]) > 2:
        # cuDNN adds the bias in a pass of its own; as a pointwise op it fuses with what follows
        nd = len(n.shape)
        bias = channel_view(c, b["bias"], nd)
        raw = list(n.attrs["args"])
        raw[2] = None
        conv = c.emit("opaque", n.op, tuple(raw), n.shape, n.dtype, {"kwargs": n.attrs["kwargs"]},
                      name=f"{n.name}_nobias")
        c.pw("add", conv, bias, final=True, shape=n.shape)
        return True
    return False


def _conv(c: Ctx, b: dict) -> bool:
    """A convolution becomes a ``conv`` node (our implicit-GEMM template, ``conv.py``) and its bias a
    pointwise add, so bias, activation, scaling and residual reach the partitioner as one epilogue."""
    n = c.node
    x, w = b.get("input"), b.get("weight")
    if not isinstance(x, Ref) or not isinstance(w, Ref) or n.shape is None:
        return False
    nd = len(n.shape) - 2
    if nd not in (1, 2, 3) or len(c.shape(x) or ()) != nd + 2 or len(c.shape(w) or ()) != nd + 2:
        return False
    if not (is_float(c.dtype(x)) and c.dtype(x) == c.dtype(w) == n.dtype):
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
    bv = channel_view(c, bias, nd + 2) if bias is not None else None
    # with a bias the bare product stays fp32, as the reference adds the bias before its one rounding
    conv = c.emit("conv", "conv_transpose" if transposed else "conv", (x, w), n.shape,
                  n.dtype if bias is None else "float32", attrs, final=bias is None)
    if bias is not None:
        c.pw("add", conv, bv, final=True, shape=n.shape)
    return True


# -- ops with a template of their own (``special.py``): one node each, run as one kernel ------------

@lowering("cumsum.default", "cumprod.default")
def _scan(c: Ctx, b: dict) -> bool:
    x = b["self"]
    if not is_float(c.dtype(x)) or not is_float(c.node.dtype):
        return False
    nd = len(c.shape(x))
    c.emit("special", c.node.op.split(".")[0], (x,), c.node.shape, c.node.dtype, {"dim": int(b["dim"]) % max(nd, 1)},
           final=True)
    return True


@lowering("embedding.default")
def _embedding(c: Ctx, b: dict) -> bool:
    w, ids = b["weight"], b["indices"]
    if not is_float(c.dtype(w)) or c.dtype(ids) not in ("int64", "int32") or len(c.shape(w)) != 2:
        return False
    c.emit("special", "embedding", (w, ids), c.node.shape, c.node.dtype, {}, final=True)
    return True


def _pair(v: Any, n: int = 2) -> list[int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(x) for x in (v * n if len(v) == 1 else v)]


def _pool(c: Ctx, b: dict, mode: str, nd: int, name: str | None = None, shape: tuple | None = None) -> bool:
    x = b["self"]
    if not is_float(c.dtype(x)) or len(c.shape(x)) not in (nd + 1, nd + 2):
        return False
    window = [b.get(a) for a in ("kernel_size", "stride", "padding", "dilation", "divisor_override")]
    if not all(isinstance(v, int) for w in window for v in (w if isinstance(w, (list, tuple)) else [w]) if v is not None):
        return False  # a size read at run time (KernelBench 98's avg_pool.kernel_size[0]): the template unrolls the taps
    k = _pair(b["kernel_size"], nd)
    attrs = {"mode": mode, "kernel": k, "stride": _pair(b.get("stride") or k, nd), "padding": _pair(b.get("padding", 0), nd),
             "dilation": _pair(b.get("dilation", 1), nd), "ceil_mode": bool(b.get("ceil_mode", False))}
    if mode == "avg":
        attrs |= {"count_include_pad": bool(b.get("count_include_pad", True)), "divisor_override": b.get("divisor_override")}
    c.emit("special", "pool", (x,), shape or c.node.shape, c.dtype(x), attrs, final=name is None, name=name)
    return True


@lowering("max_pool2d.default")
def _max_pool2d(c: Ctx, b: dict) -> bool:
    return _pool(c, b, "max", 2)


@lowering("avg_pool2d.default")
def _avg_pool2d(c: Ctx, b: dict) -> bool:
    return _pool(c, b, "avg", 2)


@lowering("avg_pool3d.default")
def _avg_pool3d(c: Ctx, b: dict) -> bool:
    return _pool(c, b, "avg", 3)


# the values of max_pool{2,3}d_with_indices (getitem 0), pooled by the same template; the indices stay ATen's
_MAX_POOL_WITH_INDICES = {"max_pool2d_with_indices.default": 2, "max_pool3d_with_indices.default": 3}


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
        if node.attrs["index"] == 0 and src.op in _MAX_POOL_WITH_INDICES and src.kind == "aten":
            # the values alone (the indices are dead code unless something reads them)
            c = Ctx(src, graph)
            if _pool(c, src.attrs["bound"], "max", _MAX_POOL_WITH_INDICES[src.op], name=node.name, shape=node.shape):
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
    c = Ctx(node, graph)
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

