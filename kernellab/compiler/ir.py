"""The builtin's graph IR: a flat, topologically ordered list of nodes with shapes and dtypes.

A node is one of
- ``input``   a forward argument (``op`` = its name);
- ``param``   a parameter or buffer of the model (``op`` = its dotted name, e.g. ``linear.weight``);
- ``pw``      a pointwise op (``op`` in :data:`POINTWISE`), computed in fp32 inside kernels;
- ``reduce``  ``sum`` / ``amax`` / ``amin`` over ``attrs["dims"]`` with ``attrs["keepdim"]``;
- ``gemm``    ``mm`` / ``bmm`` / ``linear`` / ``addmm`` / ``matmul``;
- ``conv``    ``conv`` / ``conv_transpose`` (x, weight), bias-free; ``attrs``: dims, stride, padding,
              dilation, output_padding, groups, transposed (``conv.py``'s template);
- ``special`` ``cumsum`` / ``embedding`` / ``pool`` (max or average): an op with a template of its own
              (``special.py``), attributes in ``attrs``;
- ``view``    a metadata-only ATen op (view, permute, unsqueeze...) run by PyTorch between kernels;
- ``opaque``  any other ATen op, left to PyTorch (avg pooling, ...); ``op`` = the overload name;
- ``getitem`` element ``attrs["index"]`` of a tuple-valued opaque node.
Arguments are :class:`Ref` (another node), :class:`Sym` (a size read at run time) or constants.
High-level ops (softmax, layer_norm...) arrive already expanded into ``pw``/``reduce`` nodes that
share an ``origin`` tag (``"softmax:<node>"``), which the GEMM + row-reduction fusion looks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["Ref", "Sym", "Dyn", "Node", "Graph", "POINTWISE", "FLOAT_DTYPES"]

FLOAT_DTYPES = ("float32", "float16", "bfloat16")

# pointwise ops the expression emitter knows (see ``pointwise.py``); arity is checked there
POINTWISE = frozenset({
    "add", "sub", "mul", "div", "neg", "abs", "exp", "exp2", "log", "log2", "log1p", "sqrt", "rsqrt",
    "reciprocal", "pow", "relu", "gelu", "silu", "sigmoid", "tanh", "softplus", "mish", "elu", "selu",
    "leaky_relu", "hardtanh", "clamp", "hardsigmoid", "hardswish", "maximum", "minimum", "where",
    "erf", "sin", "cos", "floor", "ceil", "sign", "cast", "identity", "eq", "ne", "lt", "le", "gt",
    "ge", "logical_not", "logical_and", "logical_or", "square",
})


@dataclass(frozen=True)
class Ref:
    """A reference to the value of another node."""

    name: str


@dataclass(frozen=True)
class Sym:
    """An integer read at run time: ``prod(node.shape[d] for d in dims)`` (a size that changes with
    the problem's size constants, found by capturing at two sizes)."""

    name: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Dyn:
    """A number computed at run time by the Python expression ``expr`` (forward scope: input and
    parameter variables, ``self``), e.g. ``self.scale`` or ``(x.shape[2] // self.heads) ** -0.5``;
    ``value`` is its value at the captured (full) size; ``refs`` the graph values it reads."""

    expr: str
    value: Any
    refs: tuple[str, ...] = ()

    def __int__(self) -> int:
        return int(self.value)

    def __float__(self) -> float:
        return float(self.value)


@dataclass
class Node:
    name: str
    kind: str
    op: str
    args: tuple = ()
    attrs: dict = field(default_factory=dict)
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    origin: str = ""

    def refs(self) -> list[str]:
        out: list[str] = []

        def walk(a: Any) -> None:
            if isinstance(a, (Ref, Sym)):
                out.append(a.name)
            elif isinstance(a, Dyn):
                out.extend(a.refs)
            elif isinstance(a, (list, tuple)):
                for x in a:
                    walk(x)
            elif isinstance(a, dict):
                for x in a.values():
                    walk(x)
        walk(self.args)
        walk(self.attrs.get("kwargs", {}))
        walk(self.attrs.get("bound", {}))
        return list(dict.fromkeys(out))


@dataclass
class Graph:
    nodes: list[Node]
    inputs: list[str]  # forward argument names, in order
    outputs: list[Any]  # Refs (or constants), in order
    single_output: bool = True
    method: str = "export"  # export | make_fx
    uncaptured: list[str] = field(default_factory=list)  # ops left to PyTorch, by name
    notes: list[str] = field(default_factory=list)
    # outputs[i] that are a buffer's new value (training-mode BatchNorm running statistics), i -> the
    # buffer's dotted name: the forward copies them into the buffer instead of returning them
    mutations: dict[int, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.reindex()

    def reindex(self) -> None:
        self.by_name = {n.name: n for n in self.nodes}
        self.users: dict[str, list[str]] = {n.name: [] for n in self.nodes}
        for n in self.nodes:
            for r in n.refs():
                self.users[r].append(n.name)
        self.position = {n.name: i for i, n in enumerate(self.nodes)}

    def node(self, name: str) -> Node:
        return self.by_name[name]

    def output_names(self) -> set[str]:
        return {o.name for o in self.outputs if isinstance(o, Ref)}

    def view_base(self, name: str) -> Node:
        """The node ``name`` views, through any chain of views (itself when it is no view)."""
        n = self.node(name)
        while n.kind == "view" and n.args and isinstance(n.args[0], Ref):
            n = self.node(n.args[0].name)
        return n

    def dump(self) -> str:
        lines = []
        for n in self.nodes:
            args = ", ".join(_fmt(a) for a in n.args)
            lines.append(f"{n.name:<20} {n.kind:<7} {n.op:<22} ({args}) {n.attrs or ''} -> {n.shape} {n.dtype}")
        lines.append(f"return {[_fmt(o) for o in self.outputs]}")
        return "\n".join(lines)


def _fmt(a: Any) -> str:
    if isinstance(a, Ref):
        return "%" + a.name
    if isinstance(a, Sym):
        return f"%{a.name}.size{list(a.dims)}"
    if isinstance(a, Dyn):
        return f"<{a.expr}={a.value!r}>"
    if isinstance(a, (list, tuple)):
        return "[" + ", ".join(_fmt(x) for x in a) + "]"
    return repr(a)
