"""Tracing: a unit's fx trace and structure key, its torch.export graph, and the flattening of its calls' arguments and outputs."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from kernellab._tracing import TRACE_LOCK
from kernellab.problem import content_hash
from kernellab.wholemodel.units import OptimizeError, Unit


def _trace(unit: Unit) -> None:
    """The unit's structure key, and its torch.fx graph where symbolic tracing works (else the graph is
    made by ``torch.export`` on the unit's actual arguments, :func:`_exported`)."""
    body = unit.body()
    parts = [type(body).__qualname__]
    for name, sub in body.named_modules():
        parts.append(f"{name}:{type(sub).__qualname__}({sub.extra_repr()})")
    for name, t in [*body.named_parameters(), *body.named_buffers()]:
        parts.append(f"{name}:{tuple(t.shape)}:{t.dtype}")
    # a leaf (BatchNorm2d) is traced as the one call of a Sequential: FX traces into a root module
    root = body if list(body.children()) else nn.Sequential(body)
    try:
        with TRACE_LOCK:
            gm = torch.fx.symbolic_trace(root)
        parts.append(gm.code)
        unit.traced = gm
    except Exception as exc:  # data-dependent control flow, a size used as a slice bound, ...
        unit.reason = f"not traceable by torch.fx ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        # the forwards' bytecode stands for the traced code (the same source gives the same key)
        for sub in body.modules():
            code = type(sub).forward.__code__
            parts.append(f"{type(sub).__qualname__}:{code.co_code.hex()}:{code.co_consts!r}:{code.co_names!r}")
    unit.key = content_hash(*parts)


def _exported(unit: Unit, args: tuple, kwargs: dict | None = None) -> tuple[nn.Module, dict | None] | None:
    """``torch.export`` of the unit on its arguments (shapes fixed: a patched unit only runs the
    winner for these), for a unit torch.fx cannot trace or one called with keyword or non-tensor
    arguments; None when export fails too (the reason is added to ``unit.reason``). Returns a plain
    GraphModule taking the call's tensors (positional, then keyword in call order; the other
    arguments are constants of the graph) and returning the output's tensors, one alone when there
    is one, with the output's structure (:func:`_out_meta`) to rebuild it, None for a bare tensor."""
    kwargs = kwargs or {}
    try:
        with torch.no_grad():
            body = copy.deepcopy(unit.body())
            out = body(*args, **kwargs)
            out_meta = _out_meta(out)
            with TRACE_LOCK:
                ep = torch.export.export(body, tuple(_detach(a) for a in args),
                                         {k: _detach(v) for k, v in kwargs.items()}).module()
        # a plain GraphModule, which pickles for the sandbox workers: positional tensor arguments, no
        # guard module (a local function), the output's tensors only
        ep.graph.set_codegen(torch.fx.graph.CodeGen())  # before the copy: export's holds pytree specs
        g = copy.deepcopy(ep.graph)
        for n in list(g.nodes):
            if n.op == "call_module" and n.target == "_guards_fn":
                g.erase_node(n)
        for n in list(g.nodes):
            if n.op == "placeholder" and not isinstance(n.meta.get("val"), torch.Tensor):
                if n.users:  # export specialises None, ints and strings; one still read is not a constant
                    raise OptimizeError(f"the non-tensor argument {n.name} is read by the graph")
                g.erase_node(n)
            elif n.op == "output":
                flat = n.args[0] if isinstance(n.args[0], (tuple, list)) else (n.args[0],)
                outs = [a for a in flat if isinstance(a, torch.fx.Node)]
                want = 1 if out_meta is None else out_meta["tensors"]
                if len(outs) != want:
                    raise OptimizeError(f"export gave {len(outs)} tensor output(s), the unit {want}")
                n.args = (outs[0] if len(outs) == 1 else tuple(outs),)
        g.eliminate_dead_code()
        g._tracer_cls, g._tracer_extras = None, None  # export's tracer class does not rebuild from a pickle
        gm = torch.fx.GraphModule(ep, g)
    except Exception as exc:
        what = f"torch.export failed{' too' if unit.reason else ''}" if not isinstance(exc, OptimizeError) else "not a problem"
        unit.reason = (unit.reason + "; " if unit.reason else "") + \
            f"{what} ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
        return None
    return gm, out_meta


def _detach(x: Any) -> Any:
    return x.detach() if isinstance(x, torch.Tensor) else x


# the non-tensor values a unit's call may hold: export bakes them into the graph as constants
_CONSTS = (type(None), bool, int, float, str)


def _flatten(tree: Any) -> tuple[list[torch.Tensor], list[tuple[int, Any]], Any] | None:
    """A call's or output's tensors, its other leaves (position, value) and its pytree structure;
    None when a leaf is neither a tensor nor a plain constant (a cache object, a module)."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(tree)
    tensors, consts = [], []
    for i, v in enumerate(leaves):
        if isinstance(v, torch.Tensor):
            tensors.append(v)
        elif isinstance(v, _CONSTS):
            consts.append((i, v))
        else:
            return None
    return tensors, consts, spec


def _flat_call(args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], tuple, str | None] | None:
    """The call's tensors (positional, then keyword in call order: export's order), their signature,
    and a descriptor of everything else: keyword names, constants, structure. The descriptor is None
    for positional tensors only, so that those calls keep the keys they always had. None when the
    call holds something other than tensors and plain constants."""
    if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
        return list(args), _signature(args), None
    # flat arguments (the usual call) without pytree: a patched unit checks every call, ~4 us not ~16
    tensors, consts = [], []
    for i, v in enumerate((*args, *kwargs.values())):
        if isinstance(v, torch.Tensor):
            tensors.append(v)
        elif isinstance(v, _CONSTS):
            consts.append((i, v))
        else:
            break
    else:
        return tensors, _signature(tuple(tensors)), f"{len(args)}|{tuple(kwargs)}|{consts!r}"
    flat = _flatten((tuple(args), dict(kwargs)))  # nested tuples, lists, dicts: pytree's order, export's too
    if flat is None:
        return None
    tensors, consts, spec = flat
    return tensors, _signature(tuple(tensors)), f"{spec}|{consts!r}"


def _out_meta(out: Any) -> dict | None:
    """What rebuilds a unit's output from the tensors a winner returns: None for a bare tensor, else
    the pytree structure (serialised) and the constant leaves (a ``(hidden, None)`` tuple)."""
    from torch.utils._pytree import treespec_dumps

    if isinstance(out, torch.Tensor):
        return None
    flat = _flatten(out)
    if flat is None or not flat[0]:
        raise OptimizeError(f"returns a {type(out).__name__} that is not tensors and plain constants")
    tensors, consts, spec = flat
    return {"spec": treespec_dumps(spec), "consts": consts, "tensors": len(tensors)}


_SPECS: dict[str, Any] = {}  # serialised output structure -> TreeSpec (module level: a deepcopy of a TreeSpec warns)


def _rebuild(out: Any, meta: dict | None) -> Any:
    """The unit's output structure around the winner's tensors (see :func:`_out_meta`)."""
    if meta is None:
        return out
    from torch.utils._pytree import tree_unflatten, treespec_loads

    spec = _SPECS.get(meta["spec"])
    if spec is None:
        spec = _SPECS[meta["spec"]] = treespec_loads(meta["spec"])
    tensors = iter([out] if isinstance(out, torch.Tensor) else list(out))
    consts = {int(i): v for i, v in meta["consts"]}
    return tree_unflatten([consts[i] if i in consts else next(tensors) for i in range(spec.num_leaves)], spec)


def _signature(args: tuple) -> tuple | None:
    """Shapes and dtypes of a call's arguments; None when one is not a tensor."""
    if not all(isinstance(a, torch.Tensor) for a in args):
        return None
    return tuple((tuple(a.shape), str(a.dtype).replace("torch.", "")) for a in args)
