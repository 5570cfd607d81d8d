"""The CLI's model argument: a KernelBench-format file or ``package.module:attr``, with its inputs."""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from kernellab.vocab import small_for
from kernellab.wholemodel.units import OptimizeError


def load_model_spec(spec: str, inputs: str | None = None, small: bool | None = None,
                    device: str | None = None) -> tuple[nn.Module, list, str]:
    """``FILE.py`` (KernelBench format: ``Model``, ``get_inputs``, ``get_init_inputs``; at SMALL sizes when
    ``small``) or ``package.module:attr`` (a module instance, a module class or a factory returning one, built
    with the module's ``get_init_inputs()`` when it has one) with inputs from ``inputs`` (``module:function``)
    or the module's ``get_inputs``; a factory or inputs function with a ``small`` parameter is passed
    ``small`` (experiments/models/library.py). The current directory is searched for the module, as
    ``python -m`` does. Returns (model, inputs, name). Raises ``OptimizeError``/``ProblemError``."""
    import importlib
    import inspect
    import os
    import sys
    from pathlib import Path

    from kernellab import env
    from kernellab.problem import instantiate, load_problem

    device = device or env.default_device()
    small = small_for(device, small)
    if spec.endswith(".py") or Path(spec).is_file():
        if inputs:
            raise OptimizeError("--inputs is for package.module:attr; a model file brings its own get_inputs")
        problem = load_problem(spec)
        inst = instantiate(problem, small=small, seed=0, device=device)
        return inst.model, inst.inputs, problem.name
    if ":" not in spec:
        raise OptimizeError(f"{spec}: not a model file (.py) nor package.module:attr")

    if os.getcwd() not in sys.path and "" not in sys.path:  # the console script's sys.path lacks it
        sys.path.append(os.getcwd())

    def sized(fn: Any) -> dict:
        try:
            return {"small": small} if "small" in inspect.signature(fn).parameters else {}
        except (TypeError, ValueError):  # a builtin without a signature
            return {}

    def resolve(ref: str) -> tuple[types.ModuleType, Any]:
        mod_name, _, attr = ref.partition(":")
        try:
            mod = importlib.import_module(mod_name)
        except ImportError as exc:
            raise OptimizeError(f"{ref}: cannot import {mod_name} ({exc})") from None
        obj: Any = mod
        for part in attr.split("."):
            if not hasattr(obj, part):
                raise OptimizeError(f"{ref}: {mod_name} has no attribute {attr}")
            obj = getattr(obj, part)
        return mod, obj

    mod, obj = resolve(spec)
    if not isinstance(obj, nn.Module):
        if not callable(obj):
            raise OptimizeError(f"{spec}: not a torch.nn.Module, a class or a factory")
        torch.manual_seed(0)
        try:
            init = list(mod.get_init_inputs()) if hasattr(mod, "get_init_inputs") else []
            obj = obj(*init, **({} if isinstance(obj, type) else sized(obj)))
        except Exception as exc:
            raise OptimizeError(f"{spec}: building the model raised {type(exc).__name__}: {exc}") from None
        if not isinstance(obj, nn.Module):
            raise OptimizeError(f"{spec}: returned a {type(obj).__name__}, not a torch.nn.Module")
    if inputs:
        _, fn = resolve(inputs)
    elif hasattr(mod, "get_inputs"):
        fn = mod.get_inputs
    else:
        raise OptimizeError(f"{spec}: give --inputs module:function (the module has no get_inputs)")
    torch.manual_seed(1)
    try:
        xs = list(fn(**sized(fn)))
    except Exception as exc:
        raise OptimizeError(f"{inputs or spec}: the inputs factory raised {type(exc).__name__}: {exc}") from None
    xs = [x.to(device) if isinstance(x, torch.Tensor) else x for x in xs]
    return obj.to(device), xs, spec.rpartition(":")[2]
