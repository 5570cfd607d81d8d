"""Problems in KernelBench format: a file with ``Model``, ``get_inputs`` and ``get_init_inputs``.

A :class:`Problem` holds the file's *source*, never a live module: every consumer (the orchestrator,
a sandbox worker, a test) executes the source into a fresh module of its own, so the module globals
that ``SMALL`` rewrites never leak between users.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import hashlib
import io
import math
import os
import tempfile
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["Problem", "ProblemError", "load_problem", "content_hash", "DEFAULT_TOLERANCES", "small_overrides",
           "derive_small"]

# (atol, rtol) per dtype, the defaults a problem's ATOL/RTOL override.
DEFAULT_TOLERANCES = {
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_REQUIRED = ("Model", "get_inputs", "get_init_inputs")


class ProblemError(ValueError):
    """A problem file (or module) that cannot be used; the message names the file and the piece."""


def content_hash(*parts: str | bytes, n: int = 16) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:n]


@dataclass(frozen=True)
class Problem:
    name: str
    source: str
    path: str | None = None
    # extra files the source needs (e.g. the pickled model of ``from_module``), name -> bytes
    artifacts: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    @property
    def id(self) -> str:
        return content_hash(self.source)

    @property
    def label(self) -> str:
        return self.path or f"<{self.name}>"

    # -- module access -------------------------------------------------------------------------
    def module(self, small: bool = False) -> types.ModuleType:
        """Execute the source into a fresh module; with ``small`` execute it with the small
        instance's constants (``SMALL``, or the derived shrink of :func:`derive_small`) in place of
        the file's own, so that constants computed from them (``bias_shape = (out, 1, 1)``) follow."""
        return _execute(self, small_overrides(self) if small else None)

    # -- numerics settings ---------------------------------------------------------------------
    def settings(self, mod: types.ModuleType | None = None) -> dict[str, Any]:
        mod = mod or self.module()
        dtype = getattr(mod, "DTYPE", "float32")
        atol, rtol = DEFAULT_TOLERANCES.get(dtype, (1e-4, 1e-4))
        return {
            "dtype": dtype,
            "atol": float(getattr(mod, "ATOL", atol)),
            "rtol": float(getattr(mod, "RTOL", rtol)),
            "small": dict(getattr(mod, "SMALL", None) or _small_or_empty(self)),
        }

    @classmethod
    def from_module(cls, model: torch.nn.Module, example_inputs: list | tuple, name: str,
                    atol: float | None = None, rtol: float | None = None) -> Problem:
        """Wrap a live model as a problem. The model and the example inputs are serialised
        (``torch.save``) into the problem so that sandbox workers can rebuild them; the model's
        class must therefore be importable (not defined in ``__main__`` of an interactive session).
        Fresh inputs for correctness trials are drawn with the shapes and dtypes of the examples."""
        if not isinstance(model, torch.nn.Module):
            raise ProblemError(f"<{name}>: model is a {type(model).__name__}, not a torch.nn.Module")
        example_inputs = list(example_inputs)
        buf = io.BytesIO()
        try:
            torch.save({"model": model.cpu(), "inputs": [_cpu(x) for x in example_inputs]}, buf)
        except Exception as exc:  # pickling a local class, a lambda, ...
            raise ProblemError(f"<{name}>: model cannot be serialised for sandbox workers: {exc}") from exc
        blob = buf.getvalue()
        tol = ""
        if atol is not None:
            tol += f"ATOL = {float(atol)!r}\n"
        if rtol is not None:
            tol += f"RTOL = {float(rtol)!r}\n"
        # the model travels inside the source (base64), so the store's copy of the source, a resumed
        # campaign, a sandbox worker and an export all rebuild it without anything else
        source = _FROM_MODULE_TEMPLATE.format(digest=content_hash(blob, n=32), tol=tol,
                                              blob=base64.b64encode(blob).decode("ascii"))
        problem = cls(name=name, source=source, path=None)
        validate(problem)
        return problem


_FROM_MODULE_TEMPLATE = '''"""A model wrapped by kernellab.Problem.from_module (artifact sha256 prefix {digest})."""
import base64
import copy
import io
import torch
{tol}
_MODEL_PT = "{blob}"
_STATE = torch.load(io.BytesIO(base64.b64decode(_MODEL_PT)), weights_only=False)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = copy.deepcopy(_STATE["model"])  # each instance its own weights, moved on its own

    def forward(self, *args):
        return self.inner(*args)


def get_init_inputs():
    return []


def get_inputs():
    out = []
    for x in _STATE["inputs"]:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            out.append(torch.randn_like(x))
        elif isinstance(x, torch.Tensor):
            out.append(x.clone())
        else:
            out.append(x)
    return out
'''


def _cpu(x: Any) -> Any:
    return x.detach().cpu() if isinstance(x, torch.Tensor) else x


# -- the small instance ----------------------------------------------------------------------------
# Caps tried in turn when a file has no SMALL: 8 first (an interpreted conv at 16 costs ~4x more);
# milder ones when the shrunk instance fails to build or run (a pooling window larger than the
# shrunk image), a smaller one when it is still too large for the interpreter (a 5-D Conv3d input).
_SHRINK_CAPS = (8, 16, 32, 64, 4)
# Elements (inputs + parameters + outputs) above which an instance is no use on the CPU: the Triton
# interpreter runs a kernel at roughly a microsecond per element and op, and a campaign runs each
# candidate many times (trials, timing).
SMALL_ELEMENT_LIMIT = 1 << 20
_SMALL_CACHE: dict[str, dict[str, Any] | str] = {}
_SETTINGS = {"ATOL", "RTOL", "DTYPE", "MODE", "SMALL"}


def _execute(problem: Problem, overrides: dict[str, Any] | None) -> types.ModuleType:
    """The problem's source executed into a fresh module; each top-level assignment of a name in
    ``overrides`` is followed by an assignment of the override, so later statements see it."""
    mod = types.ModuleType(f"kernellab_problem_{problem.name}")
    mod.__file__ = problem.path or f"<{problem.name}>"
    if problem.artifacts:
        mod.__dict__["KERNELLAB_ARTIFACTS"] = problem.artifacts
    if not overrides:
        exec(compile(problem.source, mod.__file__, "exec"), mod.__dict__)
        return mod
    tree = ast.parse(problem.source, filename=mod.__file__)
    body, seen = [], set()
    for stmt in tree.body:
        body.append(stmt)
        for name in [n for n in _bound_names(stmt) if n in overrides]:
            seen.add(name)
            body.append(ast.parse(f"{name} = _KERNELLAB_SMALL[{name!r}]").body[0])
    tree.body = body
    ast.fix_missing_locations(tree)
    mod.__dict__["_KERNELLAB_SMALL"] = dict(overrides)
    exec(compile(tree, mod.__file__, "exec"), mod.__dict__)
    del mod.__dict__["_KERNELLAB_SMALL"]
    for key, value in overrides.items():
        if key not in seen:  # bound somewhere other than a plain top-level assignment
            setattr(mod, key, value)
    return mod


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
                value = getattr(_execute(problem, None), "SMALL", None)
            return dict(value) if isinstance(value, dict) else None
    return None


def size_constants(source: str) -> dict[str, int]:
    """Top-level ``name = <int>`` (also ``a = b = <int>``) of a problem's source: the candidates for
    shrinking (the settings ATOL, RTOL, DTYPE, MODE are not sizes)."""
    out: dict[str, int] = {}

    def size(node: ast.expr) -> int | None:
        ok = isinstance(node, ast.Constant) and type(node.value) is int and node.value > 0
        return node.value if ok else None  # type: ignore[union-attr]

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


def _bound_names(stmt: ast.stmt) -> list[str]:
    """Names a top-level assignment binds (``a = b = 1``, ``h, w = 1, 2``, ``x: int = 1``)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    names: list[str] = []
    for t in targets:
        names += [e.id for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]) if isinstance(e, ast.Name)]
    return names


def shrink(constants: dict[str, int], cap: int) -> dict[str, int]:
    """Overrides capping each constant at ``cap`` while keeping the divisibility relations between
    them (channels stay a multiple of groups and heads, equal sizes stay equal)."""
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
            choice = next((c for c in range(cap, 0, -1) if all(c % d == 0 for d in divisors)), None)
            if choice is None:
                lcm = 1
                for d in divisors:
                    lcm = lcm * d // math.gcd(lcm, d)
                choice = lcm if lcm < v else v
        done[name] = choice
        if choice != v:
            new[name] = choice
    return new


def _numel(objs: Any) -> int:
    return sum(x.numel() for x in objs if isinstance(x, torch.Tensor))


def _try_small(problem: Problem, overrides: dict[str, int]) -> None:
    """Build the instance with ``overrides`` and run the reference once; raises ProblemError."""
    label = problem.label
    mod = _execute(problem, overrides)
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
            out = output_tensors(inst.model(*inst.inputs))
        except Exception as exc:
            raise ProblemError(f"{label}: Model.forward raised {type(exc).__name__}: {exc}") from None
    if out is None:
        raise ProblemError(f"{label}: Model.forward returned no tensor")


def derive_small(problem: Problem) -> dict[str, int]:
    """The small instance of a file without ``SMALL``: its top-level integer constants shrunk by
    :func:`shrink`, the first cap of ``_SHRINK_CAPS`` whose instance builds, runs and fits in
    ``SMALL_ELEMENT_LIMIT``. Deterministic (no timing), so every process derives the same one.
    Raises ProblemError (one line) when no cap gives a usable instance."""
    constants = size_constants(problem.source)
    tried: list[dict[str, int]] = []
    reasons: list[str] = []
    for cap in _SHRINK_CAPS:
        over = shrink(constants, cap)
        if over in tried:
            continue
        tried.append(over)
        try:
            _try_small(problem, over)
            return over
        except ProblemError as exc:
            reasons.append(str(exc).removeprefix(f"{problem.label}: "))
    what = "its size constants shrunk" if any(tried) else "it has no top-level integer size constants to shrink"
    raise ProblemError(f"{problem.label}: no small instance usable on the CPU ({what}: {reasons[-1]}); "
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
                hit = str(exc)
        _SMALL_CACHE[problem.id] = hit
    if isinstance(hit, str):
        raise ProblemError(hit)
    return dict(hit)


def _small_or_empty(problem: Problem) -> dict[str, Any]:
    try:
        return small_overrides(problem)
    except ProblemError:
        return {}


def load_problem(path: str | os.PathLike, validate_run: bool = True) -> Problem:
    """Read and check a problem file. Raises :class:`ProblemError` with one line naming the file
    and what is wrong. With ``validate_run`` the model is built and run once (at ``SMALL`` sizes
    when the file has them) so that a broken ``get_inputs`` or a non-tensor output fails here."""
    p = Path(path)
    if not p.exists():
        raise ProblemError(f"{p}: no such file")
    if not p.is_file():
        raise ProblemError(f"{p}: not a file")
    try:
        source = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ProblemError(f"{p}: not a Python source file (not UTF-8 text)") from None
    name = p.stem
    problem = Problem(name=name, source=source, path=str(p))
    validate(problem, run=validate_run)
    return problem


def validate(problem: Problem, run: bool = True) -> None:
    label = problem.label
    try:
        tree = ast.parse(problem.source, filename=label)
    except SyntaxError as exc:
        raise ProblemError(f"{label}: not valid Python (syntax error at line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:  # null bytes: Python 3.11 raises ValueError, not SyntaxError
        raise ProblemError(f"{label}: not valid Python ({exc})") from None
    defined = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    defined |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    missing = [r for r in _REQUIRED if r not in defined]
    if missing:
        raise ProblemError(f"{label}: missing {', '.join(missing)} (a problem defines Model, get_inputs and get_init_inputs)")
    try:
        mod = problem.module()
    except Exception as exc:
        raise ProblemError(f"{label}: executing the file raised {type(exc).__name__}: {exc}") from None
    model_cls = mod.Model
    if not (isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module)):
        raise ProblemError(f"{label}: Model is not a torch.nn.Module subclass")
    for fn in ("get_inputs", "get_init_inputs"):
        if not callable(getattr(mod, fn)):
            raise ProblemError(f"{label}: {fn} is not callable")
    dtype = getattr(mod, "DTYPE", "float32")
    if dtype not in _DTYPES:
        raise ProblemError(f"{label}: DTYPE {dtype!r} is not one of {', '.join(_DTYPES)}")
    for key in ("ATOL", "RTOL"):
        if hasattr(mod, key) and not isinstance(getattr(mod, key), (int, float)):
            raise ProblemError(f"{label}: {key} must be a number")
    small = getattr(mod, "SMALL", None)
    if small is not None:
        if not isinstance(small, dict):
            raise ProblemError(f"{label}: SMALL must be a dict of module constants")
        unknown = [k for k in small if not hasattr(mod, k)]
        if unknown:
            raise ProblemError(f"{label}: SMALL names {', '.join(map(repr, unknown))}, not a module constant of the file")
    if run:
        try:
            small_overrides(problem)
        except ProblemError:
            # no small instance: check at full size on the meta device (shapes only, nothing allocated);
            # a CPU campaign refuses such a problem (kernellab.campaign.check_campaign)
            with torch.no_grad(), torch.device("meta"):
                inst = instantiate(problem, small=False, seed=0, device="meta")
                with contextlib.suppress(Exception):  # ops without a meta kernel: the GPU run will tell
                    inst.model(*inst.inputs)
            return
        with torch.no_grad():
            instantiate(problem, small=True, seed=0, device="cpu", check=True)


@dataclass
class Instance:
    """One built instance of a problem: its module (sized), model and inputs."""

    module: types.ModuleType
    model: torch.nn.Module
    inputs: list
    dtype: torch.dtype
    init_inputs: list


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


def cast_inputs(inputs: list, dtype: torch.dtype, device: str | torch.device) -> list:
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x = x.to(device)
            if x.is_floating_point():
                x = x.to(dtype)
        out.append(x)
    return out


def instantiate(problem: Problem, small: bool, seed: int, device: str = "cpu", check: bool = False,
                model_cls: Callable[..., torch.nn.Module] | None = None,
                mod: types.ModuleType | None = None) -> Instance:
    """Build the model (seeded: the same weights for ``Model`` and any ``ModelNew``) and inputs."""
    label = problem.label
    mod = mod or problem.module(small=small)
    dtype = _DTYPES[getattr(mod, "DTYPE", "float32")]
    try:
        init = list(mod.get_init_inputs())
    except Exception as exc:
        raise ProblemError(f"{label}: get_init_inputs raised {type(exc).__name__}: {exc}") from None
    try:
        torch.manual_seed(seed)
        model = (model_cls or mod.Model)(*init)
        model = model.to(device=device, dtype=dtype)
        model.eval()
    except Exception as exc:
        raise ProblemError(f"{label}: building Model raised {type(exc).__name__}: {exc}") from None
    try:
        torch.manual_seed(seed + 1)
        inputs = list(mod.get_inputs())
    except Exception as exc:
        raise ProblemError(f"{label}: get_inputs raised {type(exc).__name__}: {exc}") from None
    inputs = cast_inputs(inputs, dtype, device)
    if check:
        try:
            out = model(*inputs)
        except Exception as exc:
            raise ProblemError(f"{label}: Model.forward raised {type(exc).__name__}: {exc}") from None
        if not output_tensors(out):
            raise ProblemError(f"{label}: Model.forward returned {type(out).__name__}, not a tensor or a tuple of tensors")
    return Instance(module=mod, model=model, inputs=inputs, dtype=dtype, init_inputs=init)


def output_tensors(out: Any) -> list[torch.Tensor] | None:
    """The outputs as a list of tensors, or None when ``out`` is not a tensor / tuple of tensors."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    return None


@contextlib.contextmanager
def problem_file(problem: Problem) -> Iterator[str]:
    """A path holding the problem's source (for tools that need a file, e.g. ncu subprocesses)."""
    if problem.path and not problem.artifacts:
        yield problem.path
        return
    with tempfile.TemporaryDirectory(prefix="kernellab-problem-") as d:
        f = Path(d) / f"{problem.name}.py"
        f.write_text(problem.source)
        yield str(f)
