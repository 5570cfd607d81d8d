"""Pointwise IR op -> Triton expression text.

Every floating value inside a generated kernel is fp32 (loads are upcast, stores downcast), so the
formulas below are written once for fp32; comparisons give Triton booleans. Only ``tl`` core
functions are used: ``libdevice`` has no Triton-interpreter implementation, so tanh, pow and log1p
are written out (tanh through exp(-2|x|), which keeps the result within 1e-7 of libdevice's).
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["emit_pw", "literal", "UnsupportedOp"]


class UnsupportedOp(ValueError):
    """The emitter has no formula for this op or these arguments."""


def literal(v: Any) -> str:
    """A Python scalar as Triton source (floats stay floats so that ints never truncate math)."""
    if isinstance(v, bool):
        return "True" if v else "False"
    v = float(v)
    if math.isnan(v):
        return 'float("nan")'
    if math.isinf(v):
        return 'float("inf")' if v > 0 else 'float("-inf")'
    return repr(v)


def _tanh(x: str) -> str:
    return f"_kl_tanh({x})"


# helpers emitted once per candidate file (jit functions usable from every kernel)
HELPERS = '''
@triton.jit
def _kl_tanh(x):
    # tanh through exp(-2|x|): no overflow for large |x|; libdevice has no interpreter version
    t = tl.exp(-2.0 * tl.abs(x))
    y = (1.0 - t) / (1.0 + t)
    return tl.where(x < 0, -y, y)


@triton.jit
def _kl_bf16(x):
    # fp32 -> nearest-even bfloat16, kept in fp32: bit arithmetic, exact on the GPU and in the Triton
    # interpreter (whose own fp32 -> bf16 cast does not round to nearest)
    b = x.to(tl.uint32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _kl_pow(x, y):
    # x ** y for real y: |x| ** y with the sign of x for odd integer y (as torch.pow)
    r = tl.exp2(y * tl.log2(tl.abs(x)))
    odd = (tl.abs(y % 2.0) == 1.0)
    r = tl.where((x < 0) & odd, -r, r)
    r = tl.where((x < 0) & (y != tl.floor(y)), float("nan"), r)
    return tl.where(y == 0.0, 1.0, r)
'''


def round_to(expr: str, dtype: str) -> str:
    """``expr`` (fp32) rounded to ``dtype`` and widened again: what the reference does when it
    stores an op's result in a half type."""
    if dtype == "bfloat16":
        return f"_kl_bf16({expr})"
    if dtype == "float16":
        return f"({expr}).to(tl.float16).to(tl.float32)"
    return expr


_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_UNARY = {"neg": "(-{a})", "abs": "tl.abs({a})", "log1p": "tl.log(1.0 + {a})", "reciprocal": "(1.0 / {a})",
          "square": "({a} * {a})", "identity": "{a}"}
_TL_UNARY = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "erf", "sin", "cos", "floor", "ceil", "sigmoid")


def emit_pw(op: str, args: list[str], attrs: dict, raw: list[Any]) -> str:
    """Triton expression for ``op`` over already-rendered ``args``; ``raw`` holds the IR arguments
    (to see which are Python scalars, e.g. a constant exponent)."""
    a = args[0] if args else None
    b = args[1] if len(args) > 1 else None
    if op in _INFIX:
        return f"({a} {_INFIX[op]} {b})"
    if op in _UNARY:
        return _UNARY[op].format(a=a)
    if op in _TL_UNARY:
        return f"tl.{op}({a})"
    if op == "cast":
        dt = attrs.get("dtype", "float32")
        if dt == "float32":
            return a
        # round through the narrow type, as the reference does when it materialises the cast
        return round_to(a, dt)
    if op == "pow":
        e = raw[1]
        if not isinstance(raw[1], (int, float)) or isinstance(raw[1], bool):
            if not isinstance(raw[0], (int, float)):
                return f"_kl_pow({a}, {b})"
            base = float(raw[0])
            if base > 0:
                return f"tl.exp2({b} * {literal(math.log2(base))})"
            return f"_kl_pow({literal(base)} + 0.0 * {b}, {b})"
        e = float(e)
        table = {1.0: f"{a}", 2.0: f"({a} * {a})", 3.0: f"({a} * {a} * {a})", 0.5: f"tl.sqrt({a})",
                 -0.5: f"tl.rsqrt({a})", -1.0: f"(1.0 / {a})", 0.0: f"({a} * 0.0 + 1.0)",
                 -2.0: f"(1.0 / ({a} * {a}))", 4.0: f"(({a} * {a}) * ({a} * {a}))"}
        if e in table:
            return table[e]
        return f"_kl_pow({a}, {literal(e)})"
    if op == "relu":
        return f"tl.maximum({a}, 0.0)"
    if op == "gelu":
        if attrs.get("approximate", "none") == "tanh":
            inner = f"0.7978845608028654 * ({a} + 0.044715 * {a} * {a} * {a})"
            return f"(0.5 * {a} * (1.0 + {_tanh(inner)}))"
        return f"(0.5 * {a} * (1.0 + tl.erf({a} * 0.7071067811865476)))"
    if op == "silu":
        return f"({a} * tl.sigmoid({a}))"
    if op == "tanh":
        return _tanh(a)
    if op == "softplus":
        beta, thr = attrs.get("beta", 1.0), attrs.get("threshold", 20.0)
        bx = f"({a} * {literal(beta)})"
        return f"tl.where({bx} > {literal(thr)}, {a}, tl.log(1.0 + tl.exp({bx})) / {literal(beta)})"
    if op == "mish":
        sp = f"tl.where({a} > 20.0, {a}, tl.log(1.0 + tl.exp({a})))"
        return f"({a} * {_tanh(sp)})"
    if op == "elu":
        al, sc, isc = (literal(attrs.get(k, d)) for k, d in (("alpha", 1.0), ("scale", 1.0), ("input_scale", 1.0)))
        return f"tl.where({a} > 0.0, {a} * {sc}, {al} * {sc} * (tl.exp({a} * {isc}) - 1.0))"
    if op == "selu":
        al, sc = "1.6732632423543772", "1.0507009873554805"
        return f"tl.where({a} > 0.0, {a} * {sc}, {al} * {sc} * (tl.exp({a}) - 1.0))"
    if op == "leaky_relu":
        return f"tl.where({a} > 0.0, {a}, {a} * {literal(attrs.get('slope', 0.01))})"
    if op == "hardtanh":
        return f"tl.minimum(tl.maximum({a}, {literal(attrs['lo'])}), {literal(attrs['hi'])})"
    if op == "clamp":
        out = a
        if raw[1] is not None:
            out = f"tl.maximum({out}, {args[1]})"
        if len(raw) > 2 and raw[2] is not None:
            out = f"tl.minimum({out}, {args[2]})"
        return out
    if op == "hardsigmoid":
        return f"tl.minimum(tl.maximum({a} / 6.0 + 0.5, 0.0), 1.0)"
    if op == "hardswish":
        return f"({a} * tl.minimum(tl.maximum({a} + 3.0, 0.0), 6.0) / 6.0)"
    if op in ("maximum", "minimum"):
        return f"tl.{op}({a}, {b})"
    if op == "where":
        return f"tl.where({a}, {b}, {args[2]})"
    if op == "sign":
        return f"tl.where({a} > 0.0, 1.0, tl.where({a} < 0.0, -1.0, 0.0 * {a}))"
    cmp = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
    if op in cmp:
        return f"({a} {cmp[op]} {b})"
    if op == "logical_not":
        return f"({a} == 0)"
    if op == "logical_and":
        return f"(({a} != 0) & ({b} != 0))"
    if op == "logical_or":
        return f"(({a} != 0) | ({b} != 0))"
    raise UnsupportedOp(f"no Triton formula for pointwise op {op!r}")


BOOL_OPS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or"})
