"""Problems in KernelBench format: a file with ``Model``, ``get_inputs`` and ``get_init_inputs``.

A :class:`Problem` holds the file's *source*, never a live module: every consumer (the orchestrator,
a sandbox worker, a test) executes the source into a fresh module of its own, so the module globals
that ``SMALL`` rewrites never leak between users.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import copy
import hashlib
import io
import os
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernellab._tracing import TRACE_LOCK

__all__ = ["Problem", "ProblemError", "load_problem", "content_hash", "execute", "DEFAULT_TOLERANCES", "MODES", "apply_mode", "declared_mode"]

# (atol, rtol) per dtype, the defaults a problem's ATOL/RTOL override.
DEFAULT_TOLERANCES = {
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (1e-2, 1e-2),
}
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_REQUIRED = ("Model", "get_inputs", "get_init_inputs")
# The mode the reference, every candidate and both baselines run in (the design contract's "Problem format").
# "train" is KernelBench's: the module as its constructor left it (training, for a fresh module:
# BatchNorm on batch statistics, dropout active); "eval" is inference.
MODES = ("train", "eval")


def apply_mode(model: torch.nn.Module, mode: str) -> torch.nn.Module:
    """Put a freshly built ``Model`` or ``ModelNew`` in the problem's mode: the one place that
    decides it, for the reference, the candidate, the baselines, the builtin's capture and the
    profiled process alike. ``"train"`` leaves the constructor's flags (KernelBench calls neither
    ``.train()`` nor ``.eval()``, so a submodule its constructor froze stays frozen)."""
    if mode == "eval":
        return model.eval()
    if mode != "train":
        raise ProblemError(f"MODE {mode!r} is not one of {', '.join(map(repr, MODES))}")
    return model


class ProblemError(ValueError):
    """A problem file (or module) that cannot be used; the message names the file and the piece."""


def content_hash(*parts: str | bytes, n: int = 16) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:n]


def execute(problem: Problem, overrides: dict[str, Any] | None) -> types.ModuleType:
    """The problem's source executed into a fresh module; each top-level assignment of a name in
    ``overrides`` is followed by an assignment of the override, so later statements see it."""
    mod = types.ModuleType(f"kernellab_problem_{problem.name}")
    mod.__file__ = problem.path or f"<{problem.name}>"
    if problem.artifacts:
        mod.__dict__["KERNELLAB_ARTIFACTS"] = problem.artifacts
    if not overrides:
        with TRACE_LOCK:  # a problem of `optimize` unpickles an fx GraphModule, and unpickling one traces it
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
    with TRACE_LOCK:
        exec(compile(tree, mod.__file__, "exec"), mod.__dict__)
    del mod.__dict__["_KERNELLAB_SMALL"]
    for key, value in overrides.items():
        if key not in seen:  # bound somewhere other than a plain top-level assignment
            setattr(mod, key, value)
    return mod


def _bound_names(stmt: ast.stmt) -> list[str]:
    """Names a top-level assignment binds (``a = b = 1``, ``h, w = 1, 2``, ``x: int = 1``)."""
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    names: list[str] = []
    for t in targets:
        names += [e.id for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]) if isinstance(e, ast.Name)]
    return names


# Problem.settings() by (source hash, artifact names): module-level constants, the same for the same source
_SETTINGS_CACHE: dict[tuple, dict[str, Any]] = {}


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
        if not small:
            return execute(self, None)
        # the small instance is found by building the problem at trial sizes (kernellab.small, the layer above):
        # reached at call time
        from kernellab.small import small_overrides

        return execute(self, small_overrides(self))

    # -- numerics settings ---------------------------------------------------------------------
    def settings(self, mod: types.ModuleType | None = None) -> dict[str, Any]:
        from kernellab.small import small_or_empty

        key = (self.id, tuple(sorted(self.artifacts)))
        if mod is None and key in _SETTINGS_CACHE:
            # executing the source again for each child's code would unpickle a from_module problem's whole
            # model each time (and re-trace an optimize subgraph's graph)
            got = _SETTINGS_CACHE[key]
            return {**got, "small": dict(got["small"])}
        mod = mod or self.module()
        dtype = getattr(mod, "DTYPE", "float32")
        atol, rtol = DEFAULT_TOLERANCES.get(dtype, (1e-4, 1e-4))
        out = {
            "dtype": dtype,
            "atol": float(getattr(mod, "ATOL", atol)),
            "rtol": float(getattr(mod, "RTOL", rtol)),
            "small": dict(getattr(mod, "SMALL", None) or small_or_empty(self)),
            "mode": getattr(mod, "MODE", "train"),
        }
        _SETTINGS_CACHE[key] = {**out, "small": dict(out["small"])}
        return out

    @property
    def mode(self) -> str:
        """``"train"`` or ``"eval"``; read from the source's syntax tree, so that callers in the
        orchestrator (the baseline cache key, ``show``) need not execute the problem."""
        return declared_mode(self.source)

    @classmethod
    def from_module(cls, model: torch.nn.Module, example_inputs: list | tuple, name: str,
                    atol: float | None = None, rtol: float | None = None,
                    stand_in_above: int | None = None) -> Problem:
        """Wrap a live model as a problem. A copy of the model and the example inputs are serialised
        (``torch.save``) into the problem so that sandbox workers can rebuild them; its classes must
        be importable there, or defined in the ``__main__`` script (their source and the script's
        imports travel with the problem), not typed into an interactive session.
        Fresh inputs for correctness trials are drawn with the shapes and dtypes of the examples.

        ``stand_in_above``: floating-point parameters of more elements than this do not travel; the
        problem draws seeded normal values of the same shape, mean and standard deviation in their
        place (buffers, masks and running statistics always travel exactly). A KernelBench-size MLP
        has 2.7 GB of weights, more than a Python source can hold; candidates are judged on the
        stand-ins, and whoever loads a winner loads the real weights into it (``kernellab.patch``)."""
        if not isinstance(model, torch.nn.Module):
            raise ProblemError(f"<{name}>: model is a {type(model).__name__}, not a torch.nn.Module")
        main_defs = _main_definitions(model, name)
        example_inputs = list(example_inputs)
        buf = io.BytesIO()
        try:
            copied, stand_ins = _copy_with_stand_ins(model, stand_in_above)
            torch.save({"model": copied, "inputs": [_cpu(x) for x in example_inputs]}, buf)
        except Exception as exc:  # copying or pickling a local class, a lambda, a lock, ...
            raise ProblemError(f"<{name}>: model cannot be serialised for sandbox workers: {exc}") from exc
        blob = buf.getvalue()
        if len(blob) > MAX_MODULE_BYTES:
            raise ProblemError(f"<{name}>: the model's tensors take {len(blob) / 2**30:.1f} GiB, more than a problem "
                               f"source carries ({MAX_MODULE_BYTES / 2**30:.0f} GiB); pass stand_in_above")
        # the model's own flag, as the user left it: a model in eval() means inference
        tol = f"MODE = {'train' if model.training else 'eval'!r}\n"
        if atol is not None:
            tol += f"ATOL = {float(atol)!r}\n"
        if rtol is not None:
            tol += f"RTOL = {float(rtol)!r}\n"
        # the model travels inside the source (base64), so the store's copy of the source, a resumed
        # campaign, a sandbox worker and an export all rebuild it without anything else
        source = _FROM_MODULE_TEMPLATE.format(digest=content_hash(blob, n=32), tol=tol, main=main_defs,
                                              blob=base64.b64encode(blob).decode("ascii"), stand_ins=repr(stand_ins))
        problem = cls(name=name, source=source, path=None)
        validate(problem)
        return problem


_FROM_MODULE_TEMPLATE = '''"""A model wrapped by kernellab.Problem.from_module (artifact sha256 prefix {digest})."""
import base64
import copy
import io
import pickle
import torch
{tol}
{main}

class _Unpickler(pickle.Unpickler):
    """Classes the user's script defined (pickled as ``__main__.X``) are this module's."""

    def find_class(self, module, name):
        if module == "__main__":
            return globals()[name]
        return super().find_class(module, name)


class _PickleModule:
    Unpickler = _Unpickler
    load = staticmethod(pickle.load)


_MODEL_PT = "{blob}"
_STATE = torch.load(io.BytesIO(base64.b64decode(_MODEL_PT)), weights_only=False, pickle_module=_PickleModule)
# large parameters that did not travel: (names of one tensor, mean, std), drawn seeded in their place
_STAND_INS = {stand_ins}


def _draw_stand_ins(model):
    for i, (names, mean, std) in enumerate(_STAND_INS):
        owner, _, leaf = names[0].rpartition(".")
        meta = getattr(model.get_submodule(owner), leaf)
        t = torch.empty(meta.shape, dtype=meta.dtype)
        t.normal_(mean, std, generator=torch.Generator().manual_seed(i))
        p = torch.nn.Parameter(t, requires_grad=meta.requires_grad)
        for n in names:
            owner, _, leaf = n.rpartition(".")
            setattr(model.get_submodule(owner), leaf, p)


_draw_stand_ins(_STATE["model"])


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


# past about 2 GiB of base64 a string literal no longer parses ("unterminated string literal")
MAX_MODULE_BYTES = 1 << 30


def _copy_with_stand_ins(model: torch.nn.Module, above: int | None) -> tuple[torch.nn.Module, list]:
    """A CPU copy of ``model`` whose floating-point parameters of more than ``above`` elements are
    meta tensors, and those parameters' (names, mean, std) for the problem to draw in their place."""
    memo: dict[int, Any] = {}
    stand_ins: dict[int, tuple[list[str], float, float]] = {}
    if above is not None:
        for n, p in model.named_parameters(remove_duplicate=False):
            if p.is_floating_point() and p.numel() > above:
                if id(p) not in stand_ins:
                    d = p.detach().float()
                    stand_ins[id(p)] = ([], float(d.mean()), float(d.std()) if p.numel() > 1 else 0.0)
                    memo[id(p)] = torch.nn.Parameter(torch.empty(p.shape, dtype=p.dtype, device="meta"),
                                                     requires_grad=p.requires_grad)
                stand_ins[id(p)][0].append(n)
    copied = copy.deepcopy(model, memo)
    copied._apply(lambda t: t if t.is_meta else t.cpu())
    return copied, [list(v) for v in stand_ins.values()]


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
    mode = getattr(mod, "MODE", "train")
    if mode not in MODES:
        raise ProblemError(f"{label}: MODE {mode!r} is not one of {', '.join(map(repr, MODES))}")
    if mode != declared_mode(problem.source):
        raise ProblemError(f"{label}: MODE must be a literal string assigned at module level (MODE = \"eval\")")
    small = getattr(mod, "SMALL", None)
    if small is not None:
        if not isinstance(small, dict):
            raise ProblemError(f"{label}: SMALL must be a dict of module constants")
        unknown = [k for k in small if not hasattr(mod, k)]
        if unknown:
            raise ProblemError(f"{label}: SMALL names {', '.join(map(repr, unknown))}, not a module constant of the file")
    if run:
        from kernellab.small import NoSmallInstance, small_overrides

        try:
            small_overrides(problem)
        except NoSmallInstance:
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


def make_inputs(mod: types.ModuleType, dtype: torch.dtype, device: str | torch.device, seed: int) -> list:
    """``get_inputs()`` seeded with ``seed``, its tensors cast to ``dtype`` on ``device``. On a GPU the
    problem's factory calls run there (``with torch.device``): a KernelBench-size ``torch.randn`` made on
    the host took seconds per sample, and the judge makes one per trial and again when it re-reads a
    large trial's inputs (70 s of a 93 s evaluation of an 8192 x 49152 GELU on the H200). The values
    then come from the device's generator, seeded the same way each time, so a sample made again is
    the same sample. A ``get_inputs`` that cannot run under a device context is run on the host."""
    dev = torch.device(device)

    def draw() -> list:
        torch.manual_seed(seed)
        return cast_inputs(list(mod.get_inputs()), dtype, dev)

    if dev.type == "cuda":
        try:
            with dev:
                return draw()
        except Exception:  # e.g. a .numpy() on a made tensor: the host's way, which raises what it raises
            pass
    return draw()


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
        model = apply_mode(model.to(device=device, dtype=dtype), getattr(mod, "MODE", "train"))
    except Exception as exc:
        raise ProblemError(f"{label}: building Model raised {type(exc).__name__}: {exc}") from None
    try:
        inputs = make_inputs(mod, dtype, device, seed + 1)
    except Exception as exc:
        raise ProblemError(f"{label}: get_inputs raised {type(exc).__name__}: {exc}") from None
    if check:
        try:
            out = model(*inputs)
        except Exception as exc:
            raise ProblemError(f"{label}: Model.forward raised {type(exc).__name__}: {exc}") from None
        if not output_tensors(out):
            raise ProblemError(f"{label}: Model.forward returned {type(out).__name__}, not a tensor or a tuple of tensors")
    return Instance(module=mod, model=model, inputs=inputs, dtype=dtype, init_inputs=init)


def declared_mode(source: str) -> str:
    """The literal ``MODE = "..."`` of a source ("train" when absent or not a literal: ``validate``
    rejects a MODE whose executed value differs from this)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return "train"
    mode = "train"
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        value = getattr(n, "value", None)
        if (any(isinstance(t, ast.Name) and t.id == "MODE" for t in targets)
                and isinstance(value, ast.Constant) and isinstance(value.value, str)):
            mode = value.value
    return mode


def output_tensors(out: Any) -> list[torch.Tensor] | None:
    """The outputs as a list of tensors, or None when ``out`` is not a tensor / tuple of tensors."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    return None


def _main_definitions(model: torch.nn.Module, name: str) -> str:
    """The source of the model's classes that live in the ``__main__`` script (which a sandbox
    worker cannot import), preceded by the script's own top-level imports."""
    import inspect
    import sys
    import textwrap

    classes = sorted({type(m) for m in model.modules() if type(m).__module__ == "__main__"},
                     key=lambda c: c.__qualname__)
    if not classes:
        return ""
    main = sys.modules.get("__main__")
    try:
        script = Path(main.__file__).read_text(encoding="utf-8")  # type: ignore[union-attr]
        bodies = [textwrap.dedent(inspect.getsource(c)) for c in classes]
    except (AttributeError, OSError, TypeError):
        raise ProblemError(f"<{name}>: the model's class {classes[0].__qualname__} was defined in an interactive "
                           "session, whose source sandbox workers cannot rebuild: define it in a file") from None
    imports = [ast.get_source_segment(script, node) for node in ast.parse(script).body
               if isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset == 0
               and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")]
    return "\n".join(i for i in imports if i) + "\n\n\n" + "\n\n".join(bodies)
