"""Watchers installed in a worker around candidate code (they run in the worker, never the caller).

- :class:`StateSnapshot`: identities of timing functions and of torch's public callables, plus the
  numerics flags that change what the *reference* computes (TF32...). Taken before the candidate
  is imported; any difference afterwards is a rejection.
- :class:`ForwardWatch`: detects calls of the reference ``Model.forward`` -- the problem's and the
  candidate's own copy of ``class Model`` (generated candidates subclass it). On Python >= 3.12 it
  watches the code objects with ``sys.monitoring`` (it sees every call, however the function was
  reached); before 3.12 it swaps the code of the forward *function objects* for a counting
  trampoline, so an alias taken at import (``_REF = Model.forward``) is watched as well.
- :class:`LaunchCounter`: counts and times the candidate's own Triton launches (``JITFunction.run``
  and, in the interpreter, ``InterpretedFunction.run``; Inductor's ``CachingAutotuner.run`` once a
  candidate imported Inductor's runtime), which gives ``own_kernel_share`` on the CPU,
  and records the names of the kernels the candidate launched (Triton, and CuPy's ``RawKernel`` /
  ``RawModule.get_function`` kernels): the GPU profiler counts exactly those as its own.
"""

from __future__ import annotations

import importlib
import sys
import threading
import time
import types
from typing import Any

import torch

# What a timing hack would patch; a change to one of these is reported as `timing_patched`.
TIMING_NAMES = ("time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.monotonic_ns", "time.time",
                "time.time_ns", "torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.Event.record",
                "torch.cuda.Event.elapsed_time", "torch.cuda.Event.synchronize", "torch.cuda.Event.query",
                "torch.cuda.Event.__init__", "torch.cuda.Event.__new__", "torch.cuda.Stream.synchronize",
                "torch.cuda.current_stream", "torch.cuda.Stream.wait_stream", "torch.cuda.Event.wait")


def _namespaces() -> dict[str, Any]:
    import torch.nn.functional as F

    return {"time": time, "torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor,
            "torch.nn.Module": torch.nn.Module, "torch.cuda": torch.cuda, "torch.cuda.Event": torch.cuda.Event,
            "torch.cuda.Stream": torch.cuda.Stream, "torch.linalg": torch.linalg, "torch.fft": torch.fft,
            "torch.testing": torch.testing}


def _flags() -> dict[str, Any]:
    out = {"float32_matmul_precision": torch.get_float32_matmul_precision(),
           "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
           "cudnn.enabled": torch.backends.cudnn.enabled,
           "deterministic": torch.are_deterministic_algorithms_enabled(),
           "grad_enabled": torch.is_grad_enabled(),
           "default_dtype": str(torch.get_default_dtype())}
    try:
        m = torch.backends.cuda.matmul
        out["matmul.allow_tf32"] = m.allow_tf32
        out["matmul.allow_fp16_reduced_precision_reduction"] = m.allow_fp16_reduced_precision_reduction
        out["matmul.allow_bf16_reduced_precision_reduction"] = m.allow_bf16_reduced_precision_reduction
    except Exception:  # pragma: no cover - older torch
        pass
    try:
        out["torch_function_modes"] = torch._C._len_torch_function_stack()
    except Exception:  # pragma: no cover
        pass
    try:
        out["dispatch_modes"] = torch._C._len_torch_dispatch_stack()
    except Exception:  # pragma: no cover
        pass
    return out


def _settle_lazy_patches() -> None:
    """Import what torch patches lazily before the snapshot: importing ``torch._dynamo`` (done by
    the torch profiler and by torch.compile) wraps e.g. ``torch.manual_seed``, which would otherwise
    look like the candidate's doing once the profiling phase imports it."""
    if torch.cuda.is_available():
        importlib.import_module("torch._dynamo")
        importlib.import_module("torch.profiler")


class StateSnapshot:
    def __init__(self) -> None:
        _settle_lazy_patches()
        self.ids = self._ids()
        self.flags = _flags()

    @staticmethod
    def _ids() -> dict[str, int]:
        out: dict[str, int] = {}
        for ns_name, ns in _namespaces().items():
            for k, v in list(vars(ns).items()):
                if k.startswith("__") and f"{ns_name}.{k}" not in TIMING_NAMES:
                    continue
                if callable(v) or isinstance(v, (staticmethod, classmethod, property)):
                    out[f"{ns_name}.{k}"] = id(v)
        return out

    def diff(self, flags_only: bool = False) -> tuple[str, list[str]] | None:
        """None when nothing changed, else (reason, changed names)."""
        flags = _flags()
        changed_flags = [k for k in self.flags if flags.get(k) != self.flags[k]]
        if not flags_only:
            now = self._ids()
            # names added since (lazy imports) are not a hack; replaced or deleted ones are
            changed = sorted(k for k in self.ids if self.ids[k] != now.get(k) and not _dynamo_disabled(k, self.ids[k]))
            timing = [k for k in changed if k in TIMING_NAMES]
            if timing:
                return "timing_patched", timing
            if changed:
                return "torch_patched", changed[:20]
        if changed_flags:
            return "global_state_changed", changed_flags
        return None


def _dynamo_disabled(key: str, old_id: int) -> bool:
    """Whether ``key`` now holds ``torch._disable_dynamo``'s wrapper of the very function it held: what
    importing ``torch._dynamo`` does to ``torch.manual_seed`` (a candidate running Inductor's generated
    code imports it; on a GPU worker ``_settle_lazy_patches`` imported it already). The wrapper calls the
    same function, so this is no patch; any other replacement still is."""
    ns_name, _, attr = key.rpartition(".")
    obj = getattr(_namespaces().get(ns_name), attr, None)
    code = getattr(obj, "__code__", None)
    if code is None or code is not _disable_code():
        return False
    cells = dict(zip(code.co_freevars, obj.__closure__ or (), strict=False))
    try:
        return "fn" in cells and id(cells["fn"].cell_contents) == old_id
    except ValueError:  # an empty cell
        return False


def _disable_code() -> types.CodeType | None:
    global _DISABLE_CODE
    if _DISABLE_CODE is None:
        try:
            _DISABLE_CODE = torch._disable_dynamo(lambda: None).__code__
        except Exception:  # pragma: no cover - a torch without it
            return None
    return _DISABLE_CODE


_DISABLE_CODE: types.CodeType | None = None


def _reference_classes(*mods: types.ModuleType | None, extra: tuple[type, ...] = ()) -> list[type]:
    """``Model`` classes of the problem module and the candidate module, and any class named ``Model``
    in ``ModelNew``'s ancestry: calling one of their ``forward`` is calling the reference."""
    out: list[type] = []
    for m in mods:
        cls = getattr(m, "Model", None) if m is not None else None
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            out.append(cls)
    for base in extra:
        for cls in base.__mro__:
            if cls.__name__ == "Model" and issubclass(cls, torch.nn.Module) and not cls.__module__.startswith("torch"):
                out.append(cls)
    return list(dict.fromkeys(out))


def _trampoline_code(freevars: tuple[str, ...]) -> types.CodeType:
    """Code for a watched forward: it hands its arguments to the hook found in its keyword-only
    default. It closes over the same names as the original (a forward that calls ``super()`` closes
    over ``__class__``), since a function's code can only be swapped for one with as many."""
    lines = ["def _factory():", *(f"    {n} = None" for n in freevars),
             "    def forward(*args, __kernellab_hook__, **kwargs):"]
    if freevars:
        lines.append("        (" + ", ".join(freevars) + ",)")
    lines += ["        return __kernellab_hook__(args, kwargs)", "    return forward"]
    ns: dict[str, Any] = {}
    exec(compile("\n".join(lines), "<kernellab-forward-watch>", "exec"), ns)
    return ns["_factory"]().__code__


class ForwardWatch:
    """Counts calls of reference ``forward`` functions while :attr:`armed`."""

    TOOL = 4  # a sys.monitoring tool id not used by debuggers (0), coverage (1), profilers (2), optimizers (5)

    def __init__(self, classes: list[type]) -> None:
        self.armed = False
        self.calls = 0
        self._restore: list[tuple[type, Any]] = []
        self._swapped: list[tuple[types.FunctionType, types.CodeType, Any]] = []
        self._codes: list[types.CodeType] = []
        funcs = [c.__dict__["forward"] for c in classes if "forward" in c.__dict__]
        mon = getattr(sys, "monitoring", None)
        if mon is not None and funcs:
            try:
                mon.use_tool_id(self.TOOL, "kernellab-sandbox")
            except ValueError:
                mon.free_tool_id(self.TOOL)
                mon.use_tool_id(self.TOOL, "kernellab-sandbox")
            mon.register_callback(self.TOOL, mon.events.PY_START, self._on_start)
            for f in funcs:
                code = getattr(f, "__code__", None)
                if code is not None:
                    self._codes.append(code)
                    mon.set_local_events(self.TOOL, code, mon.events.PY_START)
            return
        # Python < 3.12: replacing the class attribute would miss an alias the candidate took at
        # import (``_REF = Model.forward``), which is the same function object: swap its code instead.
        for cls in classes:
            orig = cls.__dict__.get("forward")
            if orig is None:
                continue
            if isinstance(orig, types.FunctionType):
                if not any(f is orig for f, _, _ in self._swapped):
                    self._swap(orig)
                continue
            def wrapped(self_: Any, *a: Any, __orig: Any = orig, __watch: Any = self, **kw: Any) -> Any:
                if __watch.armed:
                    __watch.calls += 1
                return __orig(self_, *a, **kw)

            self._restore.append((cls, orig))
            cls.forward = wrapped

    def _swap(self, f: types.FunctionType) -> None:
        code, kwdefaults = f.__code__, f.__kwdefaults__
        orig = types.FunctionType(code, f.__globals__, f.__name__, f.__defaults__, f.__closure__)
        orig.__kwdefaults__ = kwdefaults
        watch = self

        def hook(args: tuple, kwargs: dict) -> Any:
            if watch.armed:
                watch.calls += 1
            return orig(*args, **kwargs)

        f.__code__ = _trampoline_code(code.co_freevars)
        f.__kwdefaults__ = {"__kernellab_hook__": hook}
        self._swapped.append((f, code, kwdefaults))

    def _on_start(self, code: types.CodeType, offset: int) -> Any:
        if self.armed:
            self.calls += 1
        return None

    def close(self) -> None:
        mon = getattr(sys, "monitoring", None)
        if self._codes and mon is not None:
            for code in self._codes:
                mon.set_local_events(self.TOOL, code, 0)
            mon.register_callback(self.TOOL, mon.events.PY_START, None)
            mon.free_tool_id(self.TOOL)
        for cls, orig in self._restore:
            cls.forward = orig
        for f, code, kwdefaults in self._swapped:
            f.__code__ = code
            f.__kwdefaults__ = kwdefaults


class LaunchCounter:
    """Wraps Triton's launch entry points (and CuPy's raw kernels, where CuPy is installed) for the
    lifetime of a worker; counts, and records the launched kernels' names, while :attr:`armed`."""

    def __init__(self, hooks: bool = True, cupy: bool = True) -> None:
        self.armed = False
        self.launches = 0
        self.seconds = 0.0
        self.names: set[str] = set()
        self._depth = 0
        self._lock = threading.Lock()
        if not hooks:  # a bare counter, for tests of the recording itself
            return
        try:
            import importlib.util

            if cupy and importlib.util.find_spec("cupy") is not None:
                record_cupy(self, importlib.import_module("cupy"))
        except Exception:  # pragma: no cover - a broken CuPy install: its launches go unrecorded
            pass
        try:
            from triton.runtime.jit import JITFunction
        except Exception:  # pragma: no cover - no triton
            return
        targets = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            targets.append(InterpretedFunction)
        except Exception:  # pragma: no cover
            pass
        for cls in targets:
            self._wrap(cls)

    def _count(self, launch: Any, name_of: Any) -> Any:
        """Run one armed launch: count it, add its seconds (the outermost launch's only: a launch inside
        a launch is counted, its time is not added twice) and record ``name_of(what launch returned)``,
        also when the launch raised."""
        self._depth += 1
        t0 = time.perf_counter()
        out = None
        try:
            out = launch()
            return out
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.seconds += time.perf_counter() - t0
            self.launches += 1
            name = name_of(out)
            self.names.add(name if isinstance(name, str) and name else "?")

    def _wrap(self, cls: type) -> None:
        orig = cls.__dict__["run"]
        counter = self

        def run(self_, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
            if not counter.armed or warmup:
                return orig(self_, *args, grid=grid, warmup=warmup, **kwargs)
            # the compiled kernel's name is the one the profiler shows (the jit function's name unless a
            # `repr=` renamed it); the interpreter compiles nothing: the function's name
            def name_of(kernel: Any) -> Any:
                name = getattr(kernel, "name", None)
                return name if isinstance(name, str) and name else getattr(getattr(self_, "fn", None), "__name__", None)

            return counter._count(lambda: orig(self_, *args, grid=grid, warmup=warmup, **kwargs), name_of)

        cls.run = run

    def hook_inductor(self) -> bool:
        """Also count Inductor's launches (an Inductor-generated candidate): on a GPU its wrapper launches
        through ``CachingAutotuner.run`` and compiled launchers, never ``JITFunction.run``. Called once the
        candidate is loaded, since only then is Inductor's runtime imported (importing it costs seconds,
        which no other candidate should pay). The name recorded is the kernel's, as the profiler shows it.
        In the interpreter ``CachingAutotuner.run`` calls ``InterpretedFunction.run``, counted already."""
        mod = sys.modules.get("torch._inductor.runtime.triton_heuristics")
        cls = getattr(mod, "CachingAutotuner", None)
        if cls is None:
            return False
        orig = cls.__dict__.get("run")
        if orig is None or getattr(orig, "_kernellab_counted", False):
            return orig is not None
        counter = self

        def run(self_: Any, *args: Any, **kwargs: Any) -> Any:
            if not counter.armed:
                return orig(self_, *args, **kwargs)
            fn = getattr(self_, "fn", None)
            return counter._count(lambda: orig(self_, *args, **kwargs),
                                  lambda _: getattr(fn, "__name__", None) or getattr(getattr(fn, "fn", None), "__name__", None))

        run._kernellab_counted = True  # type: ignore[attr-defined]
        cls.run = run
        return True

    def record(self, name: Any) -> None:
        if self.armed and isinstance(name, str) and name:
            self.names.add(name)

    def reset(self) -> None:
        self.launches = 0
        self.seconds = 0.0
        self.names = set()


class _RecordedKernel:
    """A CuPy kernel from ``RawModule.get_function`` that records its name when launched."""

    def __init__(self, kernel: Any, name: str, counter: LaunchCounter) -> None:
        self._kernel, self._name, self._counter = kernel, name, counter

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._counter.record(self._name)
        return self._kernel(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._kernel, attr)


def record_cupy(counter: LaunchCounter, cupy: Any) -> None:
    """Make ``cupy.RawKernel`` and ``cupy.RawModule`` record the names of the kernels they launch.

    Done before any candidate is loaded, so ``import cupy`` / ``from cupy import RawKernel`` in a
    candidate finds the recording classes. A candidate that reaches CuPy's inner classes instead
    escapes the record, which only makes its kernels count as library ones, never the reverse."""
    raw_kernel, raw_module = cupy.RawKernel, cupy.RawModule

    class RawKernel(raw_kernel):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            counter.record(self.name)
            return super().__call__(*args, **kwargs)

    class RawModule(raw_module):
        def get_function(self, name: str) -> Any:
            return _RecordedKernel(super().get_function(name), name, counter)

    for new, old in ((RawKernel, raw_kernel), (RawModule, raw_module)):
        new.__name__, new.__qualname__, new.__module__, new.__doc__ = (old.__name__, old.__qualname__,
                                                                        old.__module__, old.__doc__)
    cupy.RawKernel, cupy.RawModule = RawKernel, RawModule
