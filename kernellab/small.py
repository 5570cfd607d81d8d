"""The small instance of a problem, the one the Triton interpreter runs on the CPU: the file's
``SMALL``, or one derived from its top-level integer size constants. Either way the problem's source
is executed again with the small values in place of its own, so that constants computed from them
(``bias_shape = (out_features, 1, 1)``) follow; setting the globals after the fact would not."""

from __future__ import annotations

import ast
import math
import types
from typing import Any

import torch

from kernellab.problem import DEFAULT_TOLERANCES, Problem, ProblemError, execute, instantiate, output_tensors

__all__ = ["SMALL_ELEMENT_LIMIT", "NoSmallInstance", "derive_small", "instance_sizes", "null_reference",
           "recorded_instances", "shrink", "size_constants", "small_fault", "small_or_empty", "small_overrides"]


class NoSmallInstance(ProblemError):
    """No size of the problem is usable on the CPU (too large, or failing at the sizes tried): the
    problem may still be fine at full size on a GPU. Any other ProblemError is the problem's own fault."""

# -- the small instance ----------------------------------------------------------------------------
# Caps tried in turn when a file has no SMALL: 8 first (an interpreted conv at 16 costs ~4x more);
# milder ones when the shrunk instance fails to build or run (a pooling window larger than the
# shrunk image), a smaller one when it is still too large for the interpreter (a 5-D Conv3d input).
_SHRINK_CAPS = (8, 16, 32, 64, 4)
# Elements (inputs + parameters + outputs) above which an instance is no use on the CPU: the Triton
# interpreter runs a kernel at roughly a microsecond per element and op, and a campaign runs each
# candidate many times (trials, timing).
SMALL_ELEMENT_LIMIT = 1 << 20
_SMALL_CACHE: dict[str, dict[str, Any] | ProblemError] = {}
# The trials derive_small judges a candidate size's reference on (one per distribution of the sandbox)
_NULL_TRIALS = 4
_FAULT_CACHE: dict[tuple[str, int], str | None] = {}
_SETTINGS = {"ATOL", "RTOL", "DTYPE", "MODE", "SMALL"}


def _declared_small(problem: Problem) -> dict[str, Any] | None:
    """The file's ``SMALL`` (read from its syntax tree when it is a literal, else by executing it)."""
    try:
        tree = ast.parse(problem.source)
    except (SyntaxError, ValueError):
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SMALL" for t in stmt.targets):
            try:
                value = ast.literal_eval(stmt.value)
            except ValueError:
                value = getattr(execute(problem, None), "SMALL", None)
            return dict(value) if isinstance(value, dict) else None
    return None


_INT_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
            ast.FloorDiv: lambda a, b: a // b if b else None,
            ast.Pow: lambda a, b: a ** b if 0 <= b <= 64 and abs(a) <= 1 << 16 else None}


def _int_expr(node: ast.expr) -> int | None:
    """The value of integer literal arithmetic (``2048 * 2``, ``2 ** 10``, ``-3``), read from the syntax
    tree without executing anything; None for anything else (a name, a float, a call)."""
    if isinstance(node, ast.Constant):
        return node.value if type(node.value) is int else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _int_expr(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and type(node.op) in _INT_OPS:
        a, b = _int_expr(node.left), _int_expr(node.right)
        return None if a is None or b is None else _INT_OPS[type(node.op)](a, b)
    return None


def size_constants(source: str) -> dict[str, int | tuple[int, ...]]:
    """Top-level ``name = <int>`` (also ``a = b = <int>``, an int written as literal arithmetic,
    ``N = 2048 * 2``, and a tuple or list of them with an item above 8, ``input_shape = (32768,)``) of a
    problem's source:
    the candidates for shrinking (the settings ATOL, RTOL, DTYPE, MODE are not sizes)."""
    out: dict[str, int | tuple[int, ...]] = {}

    def size(node: ast.expr) -> int | tuple[int, ...] | None:
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [_int_expr(e) for e in node.elts]
            ok = bool(items) and all(v is not None and v > 0 for v in items)
            # a tuple of small items is a window parameter (kernel, stride, padding), not a size: as
            # constants its items would only add divisibility constraints that keep sizes large
            return tuple(items) if ok and max(items) > _SHRINK_CAPS[0] else None  # type: ignore[arg-type]
        v = _int_expr(node)
        return v if v is not None and v > 0 else None

    for stmt in ast.parse(source).body:
        if not isinstance(stmt, ast.Assign):
            continue
        pairs: list[tuple[ast.expr, ast.expr]] = []
        for t in stmt.targets:
            if isinstance(t, ast.Tuple) and isinstance(stmt.value, ast.Tuple) and len(t.elts) == len(stmt.value.elts):
                pairs += list(zip(t.elts, stmt.value.elts, strict=True))  # H, W = 32, 32
            else:
                pairs.append((t, stmt.value))
        for t, v in pairs:
            if isinstance(t, ast.Name) and t.id not in _SETTINGS and size(v) is not None:
                out[t.id] = size(v)  # type: ignore[assignment]
    return out


def shrink(constants: dict[str, int], cap: int, strict: bool = False) -> dict[str, int]:
    """Overrides capping each constant at ``cap`` while keeping the divisibility relations between
    them (channels stay a multiple of groups and heads, equal sizes stay equal). ``strict``: a proper
    multiple stays a proper multiple (channels above groups: 8 channels in 8 groups normalise each
    channel alone, to zero), even above ``cap``."""
    new: dict[str, int] = {}
    done: dict[str, int] = {}
    for name, v in sorted(constants.items(), key=lambda kv: (kv[1], kv[0])):
        if v <= cap:
            done[name] = v
            continue
        same = [done[n] for n in done if constants[n] == v]
        if same:
            choice = same[0]
        else:
            divisors = {done[n] for n in done if 1 < constants[n] < v and v % constants[n] == 0}
            floor = max(divisors) + 1 if strict and divisors else 1
            choice = next((c for c in range(cap, floor - 1, -1) if all(c % d == 0 for d in divisors)), None)
            if choice is None:
                lcm = 1
                for d in divisors:
                    lcm = lcm * d // math.gcd(lcm, d)
                lcm *= -(-floor // lcm)  # the least multiple of them at or above the floor
                choice = lcm if lcm < v else v
        done[name] = choice
        if choice != v:
            new[name] = choice
    return new


def _numel(objs: Any) -> int:
    return sum(x.numel() for x in objs if isinstance(x, torch.Tensor))


class _NotTensors(ProblemError):
    """Model.forward ran and returned something other than tensors: wrong at any size."""


def _try_small(problem: Problem, overrides: dict[str, Any]) -> str | None:
    """Build the instance with ``overrides``, run the reference on the sandbox's trial inputs and
    return why a null output would pass them all (:func:`null_reference`), None when it would not;
    raises ProblemError when the instance is unusable."""
    label = problem.label
    mod = execute(problem, overrides)
    try:  # count the elements on the meta device first, so that a huge instance is never allocated
        with torch.device("meta"):
            init = list(mod.get_init_inputs())
            model = mod.Model(*init)
            size = _numel(mod.get_inputs()) + _numel(model.parameters()) + _numel(model.buffers())
    except Exception:
        size = 0  # an op without a meta kernel: the CPU build below counts
    if size > SMALL_ELEMENT_LIMIT:
        raise ProblemError(f"{label}: {size:,} elements in inputs and weights (limit {SMALL_ELEMENT_LIMIT:,})")
    with torch.no_grad():
        inst = instantiate(problem, small=False, seed=0, device="cpu", check=False, mod=mod)
        size = _numel(inst.inputs) + _numel(inst.model.parameters()) + _numel(inst.model.buffers())
        if size > SMALL_ELEMENT_LIMIT:
            raise ProblemError(f"{label}: {size:,} elements in inputs and weights (limit {SMALL_ELEMENT_LIMIT:,})")
        try:
            got = inst.model(*inst.inputs)
        except Exception as exc:
            raise ProblemError(f"{label}: Model.forward raised {type(exc).__name__}: {exc}") from None
    if output_tensors(got) is None:
        raise _NotTensors(f"{label}: Model.forward returned {type(got).__name__}, not a tensor or a tuple of tensors")
    return null_reference(problem, mod, _NULL_TRIALS)


def null_reference(problem: Problem, mod: types.ModuleType, trials: int) -> str | None:
    """Why the reference of the instance ``mod`` (built from ``problem``) cannot judge a candidate on
    the sandbox's first ``trials`` trials (the reason of ``sandbox._check.uninformative``), or None.
    Same inputs as the sandbox's trials on the CPU (seeds and distributions of ``sandbox._reference._reference``)."""
    from kernellab.problem import make_inputs
    from kernellab.sandbox._check import distribution, null_verdicts, transform, trial_atol, uninformative
    from kernellab.vocab import SEED

    inst = instantiate(problem, small=False, seed=SEED, device="cpu", mod=mod)
    # read from the module, not Problem.settings: that asks for the small instance being derived here
    default_atol, default_rtol = DEFAULT_TOLERANCES.get(getattr(mod, "DTYPE", "float32"), (1e-4, 1e-4))
    atol, rtol = float(getattr(mod, "ATOL", default_atol)), float(getattr(mod, "RTOL", default_rtol))
    refs, atols = [], []
    with torch.no_grad():
        for t in range(trials):
            base = make_inputs(mod, inst.dtype, "cpu", SEED + 1 + t)
            x = transform(base, distribution(t), torch.Generator().manual_seed(SEED + 1000 + t))
            torch.manual_seed(SEED + 500 + t)  # the sandbox's _reseed: dropout draws alike
            refs.append(output_tensors(inst.model(*x)) or [])
            atols.append(trial_atol(atol, distribution(t)))
    return uninformative(null_verdicts(refs, atols, rtol), atol, rtol)


def derive_small(problem: Problem) -> dict[str, Any]:
    """The small instance of a file without ``SMALL``: its top-level integer constants shrunk by
    :func:`shrink`, the first cap of ``_SHRINK_CAPS`` whose instance builds, runs and fits in
    ``SMALL_ELEMENT_LIMIT``. Deterministic (no timing), so every process derives the same one.
    Raises ProblemError (one line) when no cap gives a usable instance."""
    constants = size_constants(problem.source)
    # the items of a tuple constant shrink as sizes of their own, keeping the relations to the others
    flat: dict[str, int] = {}
    for name, v in constants.items():
        flat.update({f"{name}[{i}]": x for i, x in enumerate(v)} if isinstance(v, tuple) else {name: v})
    tried: list[dict[str, Any]] = []
    reasons: list[str] = []
    first_usable: dict[str, Any] | None = None
    # each cap as it is, then with proper multiples kept: tried only when the plain one's reference is
    # uninformative, so a problem that was fine keeps its instance
    for cap, strict in ((cap, strict) for cap in _SHRINK_CAPS for strict in (False, True)):
        small = shrink(flat, cap, strict)
        over: dict[str, Any] = {}
        for name, v in constants.items():
            if isinstance(v, tuple):
                items = tuple(small.get(f"{name}[{i}]", x) for i, x in enumerate(v))
                if items != v:
                    over[name] = items
            elif name in small:
                over[name] = small[name]
        if over in tried:
            continue
        tried.append(over)
        try:
            null = _try_small(problem, over)
        except _NotTensors as exc:
            raise ProblemError(str(exc)) from None
        except ProblemError as exc:
            reasons.append(str(exc).removeprefix(f"{problem.label}: "))
            continue
        if null is None:
            return over
        if first_usable is None:
            first_usable = over
    if first_usable is not None:  # uninformative at every size tried: the sandbox refuses it, with the reason
        return first_usable
    what = "its size constants shrunk" if any(tried) else "it has no top-level integer size constants to shrink"
    raise NoSmallInstance(f"{problem.label}: no small instance usable on the CPU ({what}: {reasons[-1]}); "
                          "add SMALL = {...} with small sizes, or run it on a GPU")


def small_overrides(problem: Problem) -> dict[str, Any]:
    """The constants of the problem's small instance: its ``SMALL``, else :func:`derive_small`'s.
    Cached per source hash; raises ProblemError when there is none."""
    hit = _SMALL_CACHE.get(problem.id)
    if hit is None:
        declared = _declared_small(problem)
        if declared is not None:
            hit = declared
        else:
            try:
                hit = derive_small(problem)
            except ProblemError as exc:
                hit = exc
        _SMALL_CACHE[problem.id] = hit
    if isinstance(hit, ProblemError):
        raise type(hit)(str(hit))
    return dict(hit)


def small_fault(problem: Problem, trials: int) -> str | None:
    """Why the small instance cannot judge any candidate on ``trials`` trials (:func:`null_reference`:
    a null output passes them all), or None. Cached per (source hash, trials); ProblemError as
    :func:`small_overrides` raises it."""
    # past two rounds of the distributions more trials only repeat them with other seeds (and a
    # campaign may ask for thousands: --trials 3000 would run the reference that often here)
    key = (problem.id, trials := min(trials, 2 * _NULL_TRIALS))
    if key not in _FAULT_CACHE:
        _FAULT_CACHE[key] = null_reference(problem, execute(problem, small_overrides(problem)), trials)
    return _FAULT_CACHE[key]


def instance_sizes(problem: Problem, small: bool) -> dict[str, Any]:
    """The sizes an evaluation of ``problem`` runs at, for the run's first lines, ``show`` and the
    report: ``{"small", "sizes" (the overrides), "source" ("SMALL", "derived" or "full"), "text"}``."""
    if not small:
        return {"small": False, "sizes": {}, "source": "full", "text": "full size (the file's own constants)"}
    sizes = small_or_empty(problem)
    source = "SMALL" if _declared_small(problem) is not None else "derived"
    shown = ", ".join(f"{k}={v}" for k, v in sizes.items()) or "the file's own constants"
    why = "the file's SMALL" if source == "SMALL" else "derived from the file's size constants"
    return {"small": True, "sizes": sizes, "source": source, "text": f"small instance {shown} ({why})"}


def small_or_empty(problem: Problem) -> dict[str, Any]:
    try:
        return small_overrides(problem)
    except ProblemError:
        return {}


def recorded_instances(evaluations: list[dict]) -> list[str]:
    """The sizes a problem's evaluations ran at, as the sandbox recorded them (``details.instance``):
    each distinct text once, in order (``show`` and the report print them)."""
    out: list[str] = []
    for e in evaluations:
        text = ((e.get("details") or {}).get("instance") or {}).get("text")
        if text and text not in out:
            out.append(text)
    return out
