"""The patched modules: a unit's winner installed in place of its PyTorch forward, and taken out again."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from kernellab.wholemodel.tracing import _flat_call, _rebuild
from kernellab.wholemodel.units import Unit


class _Fast:
    """One winner bound to a unit: its ``ModelNew`` loaded with the unit's own weights, and when it may run."""

    def __init__(self, module: nn.Module, signature: tuple, training: bool, device: str, info: dict,
                 names: str = "module", start: int = 0, call: str | None = None, out: dict | None = None):
        self.module, self.signature, self.training, self.device, self.info = module, signature, training, device, info
        # the call's keywords and constants the winner was judged with, and the unit's output structure
        self.call, self.out = call, out
        # how the winner's ``inner.<name>`` names the unit's tensors: "module" (the same path in the unit),
        # "leaf" (a leaf traced as ``Sequential(leaf)``: "0.<attr>") or "region" (a slice of a Sequential
        # from ``start``: "<i>.<rest>" is child start+i). No reference to the unit is kept: a cycle through
        # the unit breaks copy.deepcopy of a GraphModule.
        self.names, self.start = names, start

    def _unit_path(self, name: str) -> str:
        if self.names == "leaf":
            return name.split(".", 1)[1]
        if self.names == "region":
            head, _, rest = name.partition(".")
            return f"{self.start + int(head)}.{rest}"
        return name

    def tie(self, root: nn.Module) -> None:
        """Make the winner's weights and buffers the unit's own tensors (``root``: the unit, or the
        Sequential of a region), so that ``load_state_dict``, an optimizer step or BatchNorm's running
        statistics reach both paths. Called again after ``.to()``, which gives buffers new tensors."""
        for name, _ in [*self.module.named_parameters(), *self.module.named_buffers()]:
            if not name.startswith("inner."):
                continue
            owner_path, _, attr = name.rpartition(".")
            try:
                src_path = self._unit_path(name[len("inner."):]).rpartition(".")[0]
                src_owner = root.get_submodule(src_path)
            except (AttributeError, IndexError, ValueError):
                continue
            owner = self.module.get_submodule(owner_path)
            if attr in owner._parameters and attr in src_owner._parameters:
                owner._parameters[attr] = src_owner._parameters[attr]
            elif attr in owner._buffers and attr in src_owner._buffers:
                owner._buffers[attr] = src_owner._buffers[attr]

    def take(self, owner: nn.Module, args: tuple, kwargs: dict) -> list[torch.Tensor] | None:
        """The tensors to call the winner with, or None when this call must run PyTorch: the kernels
        compute a forward only, for the shapes, constants, mode and device they were judged on."""
        if owner.training != self.training:
            return None
        flat = _flat_call(args, kwargs)
        if flat is None or flat[1] != self.signature or flat[2] != self.call:
            return None
        tensors = flat[0]
        if any(a.device.type != self.device for a in tensors):
            return None
        if torch.is_grad_enabled() and (any(a.requires_grad for a in tensors)
                                        or any(p.requires_grad for p in owner.parameters())):
            return None
        return tensors

    def fits(self, owner: nn.Module, args: tuple, kwargs: dict) -> bool:
        return self.take(owner, args, kwargs) is not None

    def run(self, tensors: list[torch.Tensor]) -> Any:
        return _rebuild(self.module(*tensors), self.out)


class _PatchedModule(nn.Module):
    """Mixed in before the unit's own class: the forward runs the winner when it fits, else the class's own."""

    _kernellab_fast: _Fast

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        fast = self.__dict__.get("_kernellab_fast")
        tensors = fast.take(self, args, kwargs) if fast is not None else None
        if tensors is not None:
            return fast.run(tensors)
        return super().forward(*args, **kwargs)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:  # .to(), .cuda(), .half() move the winner too
        out = super()._apply(fn, recurse)
        fast = self.__dict__.get("_kernellab_fast")
        if fast is not None:  # the tied tensors moved with the unit; the winner's own constants move here
            fast.module._apply(fn, recurse)
            fast.tie(self)
        return out


class _PatchedSequential(nn.Sequential):
    """A Sequential some of whose slices run a winner; its children (and state_dict keys) are unchanged."""

    def forward(self, input: Any) -> Any:
        kids = list(self._modules.values())
        regions = self.__dict__.get("_kernellab_regions", {})
        i = 0
        while i < len(kids):
            r = regions.get(i)
            if r is not None and r[1].fits(self, (input,), {}):
                input = r[1].run([input])
                i = r[0]
                continue
            input = kids[i](input)
            i += 1
        return input

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        out = super()._apply(fn, recurse)
        for _, fast in self.__dict__.get("_kernellab_regions", {}).values():
            fast.module._apply(fn, recurse)
            fast.tie(self)
        return out


_CLASSES: dict[type, type] = {}


def _patched_class(cls: type) -> type:
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Patched{cls.__name__}", (_PatchedModule, cls), {"__module__": cls.__module__})
    return _CLASSES[cls]



def _install(u: Unit, fast: _Fast) -> None:
    fast.tie(u.module)
    if u.start is None:
        m = u.module
        m.__class__ = _patched_class(type(m))
        m.__dict__["_kernellab_fast"] = fast
    else:
        seq = u.module
        if not isinstance(seq, _PatchedSequential):
            seq.__class__ = _PatchedSequential if type(seq) is nn.Sequential else \
                type(f"Patched{type(seq).__name__}", (_PatchedSequential, type(seq)), {})
            seq.__dict__["_kernellab_regions"] = {}
        seq.__dict__["_kernellab_regions"][u.start] = (u.end, fast)


def _uninstall(u: Unit) -> None:
    if u.start is None:
        u.module.__dict__.pop("_kernellab_fast", None)
    else:
        u.module.__dict__.get("_kernellab_regions", {}).pop(u.start, None)
