"""Capture a problem's ``Model`` as an ATen-level :class:`~.ir.Graph` with shapes and dtypes.

How: build the model and its inputs on the ``meta`` device (no memory, no compute, any size), then
``torch.export`` it and run the default decompositions *except* for the ops the builtin lowers itself
(linear, softmax, layer_norm...: keeping them whole lets the partitioner see a GEMM or a softmax).
When export fails, ``make_fx`` (torch.fx tracing through the dispatcher, pre-dispatch so the same
high-level ops survive) is tried. Ops outside the builtin's tables stay in the graph as ``opaque``
nodes, run by PyTorch; they are listed in ``Graph.uncaptured``.

Sizes: a candidate is evaluated at the problem's full size on a GPU and at its ``SMALL`` size on
the CPU, so the generated code must not bake sizes. The graph is captured at both sizes; an integer
argument that differs (a ``view`` target shape, say) is resolved to a :class:`~.ir.Sym` — a product
of dimensions of some earlier value whose sizes match at both sizes — and read at run time.
"""

from __future__ import annotations

import math
import operator
import types
import warnings
from typing import Any

import torch

from kernellab._tracing import TRACE_LOCK, quiet_stderr
from kernellab.problem import Problem, apply_mode, cast_inputs, torch_dtype
from kernellab.small import small_or_empty

from .ir import FLOAT_DTYPES, Dyn, Graph, Node, Ref, Sym
from .lowering import VIEW_OPS, lower_node

__all__ = ["capture", "CaptureError"]

# ops kept whole through the decompositions: each has a lowering in ``lower.py``
_KEEP = [
    "linear.default", "mm.default", "addmm.default", "bmm.default", "matmul.default",
    "softmax.int", "_softmax.default", "log_softmax.int", "_log_softmax.default", "logsumexp.default",
    "layer_norm.default", "rms_norm.default", "group_norm.default", "instance_norm.default",
    "batch_norm.default", "gelu.default", "silu.default", "mish.default", "hardswish.default",
    "hardsigmoid.default", "softplus.default", "elu.default", "selu.default", "leaky_relu.default",
    "hardtanh.default", "var.dim", "var.correction", "std.dim", "std.correction", "mean.dim",
    "dropout.default", "sigmoid.default", "tanh.default", "relu.default", "clamp.default",
]


class CaptureError(RuntimeError):
    """The model could not be captured at all (neither torch.export nor make_fx)."""


def capture(problem: Problem, method: str = "auto") -> Graph:
    """The problem's graph at its full size, with sizes that change under ``SMALL`` as ``Sym``."""
    with TRACE_LOCK:
        graph = _capture_at(problem, small=False, method=method)
        if small_or_empty(problem):  # SMALL, or the derived small instance of a file without one
            try:
                small = _capture_at(problem, small=True, method=graph.method)
                _resolve_sizes(graph, small)
            except CaptureError as exc:
                graph.notes.append(f"SMALL capture failed ({exc}); sizes are those of the full problem")
    lowered: list[Node] = []
    for n in graph.nodes:
        lowered.extend(lower_node(n, graph))
    graph.nodes = _asap(_dead_code(lowered, graph.outputs))
    graph.reindex()
    graph.uncaptured = sorted({n.op for n in graph.nodes if n.kind == "opaque"})
    return graph


# -- building the model on the meta device --------------------------------------------------------

def _build(problem: Problem, small: bool, device: str) -> tuple[torch.nn.Module, list, list[str]]:
    mod = problem.module(small=small)
    dtype = torch_dtype(getattr(mod, "DTYPE", "float32"))
    with torch.device(device), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        model = mod.Model(*mod.get_init_inputs())
        inputs = list(mod.get_inputs())
    model = apply_mode(model.to(device=device, dtype=dtype), getattr(mod, "MODE", "train"))
    inputs = cast_inputs(inputs, dtype, device)
    _NUMBERS[id(model)] = _numbers(model)
    import inspect
    try:
        names = [p for p in inspect.signature(model.forward).parameters if p != "self"]
    except (TypeError, ValueError):
        names = []
    names = [n for n in names][: len(inputs)]
    names += [f"arg{i}" for i in range(len(names), len(inputs))]
    return model, inputs, names


def _capture_at(problem: Problem, small: bool, method: str) -> Graph:
    errors = []
    for device in ("meta", "cpu"):
        try:
            model, inputs, names = _build(problem, small, device)
        except Exception as exc:  # e.g. an __init__ that reads data
            errors.append(f"building on {device}: {type(exc).__name__}: {exc}")
            continue
        order = ["export", "make_fx"] if method in ("auto", "export") else ["make_fx"]
        if method == "export":
            order = ["export"]
        for how in order:
            try:
                with quiet_stderr(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    fx, names_of, single, mutated = (_export if how == "export" else _make_fx)(model, inputs, names)
                g = _translate(fx, names_of, single, how)
                g.mutations = mutated
                g.numbers = _NUMBERS.pop(id(model), {})
                return g
            except Exception as exc:
                errors.append(f"{how} on {device}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    raise CaptureError("; ".join(errors))


def _keep_table() -> Any:
    table = torch.export.default_decompositions()
    for name in _KEEP:
        packet, overload = name.split(".")
        op = getattr(getattr(torch.ops.aten, packet), overload, None)
        if op is not None:
            table.pop(op, None)
    return table


def _export(model: torch.nn.Module, inputs: list, names: list[str]):
    ep = torch.export.export(model, tuple(inputs), strict=False)
    ep = ep.run_decompositions(_keep_table())
    sig = ep.graph_signature
    consts = getattr(sig, "inputs_to_lifted_tensor_constants", None) or {}
    if consts:
        _inline_scalar_constants(ep.graph_module.graph, consts, ep.constants)
    placeholder_names: dict[str, tuple[str, str]] = {}
    for ph, fqn in sig.inputs_to_parameters.items():
        placeholder_names[ph] = ("param", fqn)
    for ph, fqn in sig.inputs_to_buffers.items():
        placeholder_names[ph] = ("param", fqn)
    user = [s for s in sig.user_inputs]
    for i, ph in enumerate(user):
        placeholder_names[ph] = ("input", names[i])
    out_spec = ep.call_spec.out_spec
    single = out_spec is not None and out_spec.is_leaf()
    # A training-mode BatchNorm updates its running statistics: export returns the new buffer values
    # as extra outputs ahead of the user's; the generated forward writes them back into the buffers.
    from torch.export.graph_signature import OutputKind

    mutated: dict[int, str] = {}
    for i, spec in enumerate(sig.output_specs):
        if spec.kind == OutputKind.BUFFER_MUTATION:
            mutated[i] = spec.target
        elif spec.kind != OutputKind.USER_OUTPUT:
            raise CaptureError(f"forward mutates {spec.kind.name.lower()} {spec.target or ''}".strip())
    return ep.graph_module.graph, placeholder_names, single, mutated


# ops a constant passes through unchanged (torch.tensor(c) exports as a copy of a lifted constant)
_CONST_COPIES = ("clone.default", "lift_fresh_copy.default", "detach.default", "alias.default", "_to_copy.default")


def _scalar_ok(op: str) -> bool:
    """Whether lower.py's lowering of ``op`` takes a Python number where a tensor operand was
    (binary ops, add/sub, where, clamp)."""
    from .lowering import _BINARY

    return op in _BINARY or op in ("add.Tensor", "sub.Tensor", "rsub.Tensor", "where.self", "clamp.Tensor",
                                   "clamp_min.Tensor", "clamp_max.Tensor")


def _inline_scalar_constants(fx: torch.fx.Graph, consts: dict[str, str], values: dict) -> None:
    """Replace each 0-d tensor constant built in forward (``torch.min(x, torch.tensor(0.5))``) by its
    value, as the Python number the lowerings take (a 0-d operand broadcasts like one). Raises
    CaptureError for a larger constant or one read by an op that needs a tensor."""
    for ph in [n for n in fx.nodes if n.op == "placeholder" and n.name in consts]:
        t = values.get(consts[ph.name])
        if not isinstance(t, torch.Tensor) or t.dim() != 0 or t.dtype == torch.bool or t.is_complex():
            raise CaptureError("tensor constants created in forward are supported as 0-d numbers only")
        value = t.item()
        copies, users, todo = [], [], [ph]
        while todo:
            for u in todo.pop().users:
                name = f"{u.target._schema.name.split('::')[1]}.{u.target._overloadname}" \
                    if isinstance(u.target, torch._ops.OpOverload) else ""
                val = _val(u)
                if name in _CONST_COPIES:
                    copies.append(u)
                    todo.append(u)
                elif _scalar_ok(name) and isinstance(val, torch.Tensor) and val.is_floating_point():
                    users.append(u)
                else:
                    raise CaptureError(f"the tensor constant {ph.name} built in forward is read by {name or u.op}")
        sources = {ph, *copies}
        for u in users:
            u.args = tuple(value if a in sources else a for a in u.args)
            u.kwargs = {k: value if a in sources else a for k, a in u.kwargs.items()}
        for n in reversed(copies):
            fx.erase_node(n)
        fx.erase_node(ph)


def _make_fx(model: torch.nn.Module, inputs: list, names: list[str]):
    from torch.fx.experimental.proxy_tensor import make_fx

    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())

    def f(p, b, *args):
        return torch.func.functional_call(model, {**p, **b}, args)

    gm = make_fx(f, pre_dispatch=True)(params, buffers, *inputs)
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    order = [("param", k) for k in params] + [("param", k) for k in buffers] + [("input", n) for n in names]
    placeholder_names = {ph.name: order[i] for i, ph in enumerate(phs)}
    out = next(n for n in gm.graph.nodes if n.op == "output")
    single = not isinstance(out.args[0], (list, tuple)) or (len(out.args[0]) == 1 and isinstance(
        _val(out.args[0][0]), torch.Tensor) and not isinstance(model(*inputs), (tuple, list)))
    # buffers updated in place (training-mode BatchNorm) stay in-place ATen calls on the buffer nodes
    return gm.graph, placeholder_names, single, {}


# -- fx -> IR -------------------------------------------------------------------------------------

def _val(fxnode: Any) -> Any:
    return fxnode.meta.get("val") if hasattr(fxnode, "meta") else None


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def _conv_arg(a: Any) -> Any:
    if isinstance(a, torch.fx.Node):
        return Ref(a.name)
    if isinstance(a, (list, tuple)):
        return type(a)(_conv_arg(x) for x in a)
    return a


def _bind(target: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Arguments of an ATen call by schema name, defaults filled in."""
    out: dict[str, Any] = {}
    schema = target._schema
    pos = list(args)
    for i, arg in enumerate(schema.arguments):
        if i < len(pos) and not arg.kwarg_only:
            out[arg.name] = pos[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def _translate(fx: torch.fx.Graph, placeholders: dict[str, tuple[str, str]], single: bool, method: str) -> Graph:
    nodes: list[Node] = []
    inputs: list[str] = []
    outputs: list[Any] = []
    for fn in fx.nodes:
        val = _val(fn)
        shape = tuple(int(s) for s in val.shape) if isinstance(val, torch.Tensor) else None
        dtype = _dtype_name(val.dtype) if isinstance(val, torch.Tensor) else None
        if fn.op == "placeholder":
            kind, label = placeholders.get(fn.name, ("input", fn.name))
            if kind == "input":
                inputs.append(fn.name)
            nodes.append(Node(fn.name, kind, label, shape=shape, dtype=dtype))
        elif fn.op == "output":
            res = fn.args[0]
            res = res if isinstance(res, (list, tuple)) else [res]
            outputs = [_conv_arg(r) for r in res]
        elif fn.op == "call_function":
            if fn.target is operator.getitem:
                nodes.append(Node(fn.name, "getitem", "getitem", (Ref(fn.args[0].name),),
                                  {"index": fn.args[1]}, shape, dtype))
                continue
            if not isinstance(fn.target, torch._ops.OpOverload):
                raise CaptureError(f"unsupported call {fn.target} at {fn.name}")
            if fn.target is torch.ops.aten._assert_tensor_metadata.default:
                continue
            name = f"{fn.target._schema.name.split('::')[1]}.{fn.target._overloadname}"
            bound = {k: _conv_arg(v) for k, v in _bind(fn.target, fn.args, fn.kwargs).items()}
            kind = "aten"  # raw: lowered later by lower_node
            nodes.append(Node(fn.name, kind, name, (), {"bound": bound, "args": _conv_arg(fn.args),
                                                          "kwargs": _conv_arg(dict(fn.kwargs))}, shape, dtype))
        else:
            raise CaptureError(f"unsupported fx node {fn.op} {fn.name}")
    g = Graph(nodes=nodes, inputs=inputs, outputs=outputs, single_output=single, method=method)
    return g


def _asap(nodes: list[Node]) -> list[Node]:
    """Topological order with every node as early as its inputs allow (stable otherwise): side
    computations (a parameter view, an activation of a small operand) then come before the groups
    that read them, which the partitioner's no-cycle rule requires for fusion."""
    level: dict[str, int] = {}
    for n in nodes:
        level[n.name] = 1 + max((level.get(r, 0) for r in n.refs()), default=0)
    order = {n.name: i for i, n in enumerate(nodes)}
    return sorted(nodes, key=lambda n: (level[n.name], order[n.name]))


def _dead_code(nodes: list[Node], outputs: list[Any]) -> list[Node]:
    live = {o.name for o in outputs if isinstance(o, Ref)}
    keep: list[Node] = []
    for n in reversed(nodes):
        if n.name in live or n.kind == "input":
            keep.append(n)
            live.update(n.refs())
    return list(reversed(keep))


# -- sizes that change with SMALL -----------------------------------------------------------------

_NUMBERS: dict[int, dict[str, float]] = {}
_UNRESOLVED = object()


def _numbers(model: torch.nn.Module) -> dict[str, float]:
    """Plain int/float attributes of the model's modules (``scale``, ``gn.num_groups``...), and the
    items of int/float tuples and lists (``avg_pool.kernel_size[0]``: nn.AvgPool1d keeps ``(16,)``):
    the values a forward bakes into the graph that SMALL may change."""
    out: dict[str, float] = {}

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    for path, mod in model.named_modules():
        for k, v in vars(mod).items():
            if k.startswith("_"):
                continue
            if not all(p.isidentifier() for p in (path.split(".") if path else [])) or not k.isidentifier():
                continue
            key = f"{path}.{k}" if path else k
            if number(v):
                out[key] = v
            elif isinstance(v, (tuple, list)) and 0 < len(v) <= 8 and all(number(x) for x in v):
                out.update({f"{key}[{i}]": x for i, x in enumerate(v)})
    return out


def _close(x: float, y: float) -> bool:
    return x == y or (math.isfinite(x) and math.isfinite(y) and abs(x - y) <= 1e-9 * max(abs(x), abs(y)))


def _solve(full: float, small: float, atoms: list[tuple[str, float, float, tuple]], want_int: bool) -> Dyn | None:
    """A small expression over sizes and model attributes worth ``full`` and ``small`` at the two
    sizes: an atom, a product or quotient of two, then optionally -1 or +1 (integers), **-0.5, **0.5,
    **-0.25, **0.25 or 1/x (scaled_dot_product_attention's decomposition scales q and k each by
    E ** -0.25)."""
    cands = list(atoms)
    for t1, x1, y1, r1 in atoms:
        for t2, x2, y2, r2 in atoms:
            if t1 == t2:
                continue
            cands.append((f"({t1} * {t2})", x1 * x2, y1 * y2, r1 + r2))
            if x2 and y2:
                if want_int:
                    cands.append((f"({t1} // {t2})", x1 // x2, y1 // y2, r1 + r2))
                else:
                    cands.append((f"({t1} / {t2})", x1 / x2, y1 / y2, r1 + r2))
    fns: list[tuple[str, Any]] = [("{}", lambda v: v)]
    if want_int:  # an exclusive scan's narrow(length=x.size(d) - 1)
        fns += [("({} - 1)", lambda v: v - 1), ("({} + 1)", lambda v: v + 1)]
    else:
        fns += [("{} ** -0.5", lambda v: v ** -0.5 if v > 0 else math.nan),
                ("{} ** 0.5", lambda v: v ** 0.5 if v >= 0 else math.nan),
                ("{} ** -0.25", lambda v: v ** -0.25 if v > 0 else math.nan),
                ("{} ** 0.25", lambda v: v ** 0.25 if v >= 0 else math.nan),
                ("1.0 / {}", lambda v: 1.0 / v if v else math.nan)]
    for fmt, f in fns:
        for t, x, y, r in cands:
            if _close(f(x), full) and _close(f(y), small):
                return Dyn(fmt.format(t), full, tuple(dict.fromkeys(r)))
    return None

def _resolve_sizes(full: Graph, small: Graph) -> None:
    """Replace integers that differ between the two captures by ``Sym`` sizes read at run time."""
    if [(n.name, n.op) for n in full.nodes] != [(n.name, n.op) for n in small.nodes]:
        raise CaptureError("the graph's structure changes with SMALL")
    shapes_small = {n.name: n.shape for n in small.nodes}
    nums_f, nums_s = getattr(full, "numbers", {}), getattr(small, "numbers", {})
    atoms: list[tuple[str, float, float, tuple]] = [
        (f"self.{k}", v, nums_s[k], ()) for k, v in nums_f.items() if k in nums_s]
    for n in full.nodes:
        if n.kind in ("input", "param") and n.shape and shapes_small.get(n.name):
            atoms += [(f"{n.name}.shape[{i}]", d, shapes_small[n.name][i], (n.name,)) for i, d in enumerate(n.shape)]
    ctx = {"seen": [], "shapes_small": shapes_small, "atoms": atoms}
    for nf, ns in zip(full.nodes, small.nodes, strict=True):
        if nf.kind == "aten":
            for key in ("bound", "args", "kwargs"):
                nf.attrs[key] = _merge(nf.attrs[key], ns.attrs[key], nf, ctx)
        ctx["seen"].append(nf)


def _merge(a: Any, b: Any, node: Node, ctx: dict, top: bool = True) -> Any:
    if isinstance(a, bool) or isinstance(b, bool):
        return a
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if a == b or (isinstance(a, float) and math.isnan(a) and math.isnan(b)):
            return a
        want_int = isinstance(a, int) and isinstance(b, int)
        found = _find_size(a, b, node, ctx["seen"], ctx["shapes_small"]) if want_int else None
        if isinstance(found, Sym) and _scalar_ok(node.op) and found.dims:
            # an operand of arithmetic (kl_div's batchmean divides by the batch size), not a shape:
            # kernels take run-time numbers as Dyn scalars
            expr = " * ".join(f"{found.name}.shape[{d}]" for d in found.dims)
            found = Dyn(f"({expr})" if len(found.dims) > 1 else expr, a, (found.name,))
        found = found or _solve(a, b, ctx["atoms"], want_int)
        if found is None:
            if not top:
                return _UNRESOLVED
            raise CaptureError(f"{node.name}: the constant {a} (SMALL: {b}) matches no size or model attribute")
        return found
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        out = [_merge(x, y, node, ctx, top=False) for x, y in zip(a, b, strict=True)]
        holes = [i for i, x in enumerate(out) if x is _UNRESOLVED]
        # a view's target shape may leave one size for PyTorch to infer
        if len(holes) == 1 and -1 not in out and node.op.split(".")[0] in ("view", "reshape", "_unsafe_view"):
            out[holes[0]] = -1
        elif holes:
            raise CaptureError(f"{node.name}: sizes {[a[i] for i in holes]} (SMALL: {[b[i] for i in holes]}) "
                               "match no dimension or model attribute")
        return type(a)(out)
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: _merge(a[k], b.get(k), node, ctx) for k in a}
    return a


def _find_size(full: int, small: int, node: Node, seen: list[Node], shapes_small: dict) -> Sym | None:
    first = [r for r in node.refs()] if node.kind != "aten" else _raw_refs(node)
    order = [s for s in seen if s.name in first] + [s for s in seen if s.kind == "input"] + list(reversed(seen))
    for cand in order:
        sf, ss = cand.shape, shapes_small.get(cand.name)
        if not sf or not ss or len(sf) != len(ss):
            continue
        for i in range(len(sf)):  # a single dimension first, then products of ranges
            for j in range(i, len(sf)):
                if math.prod(sf[i:j + 1]) == full and math.prod(ss[i:j + 1]) == small:
                    return Sym(cand.name, tuple(range(i, j + 1)))
    return None


def _raw_refs(node: Node) -> list[str]:
    out: list[str] = []

    def walk(a: Any) -> None:
        if isinstance(a, Ref):
            out.append(a.name)
        elif isinstance(a, (list, tuple)):
            for x in a:
                walk(x)
        elif isinstance(a, dict):
            for x in a.values():
                walk(x)
    walk(node.attrs.get("bound", {}))
    return out


_ = (VIEW_OPS, FLOAT_DTYPES, types)
