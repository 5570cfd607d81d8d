"""Splitting: a model's module tree cut into units (fusion regions), each a problem once deduplicated."""

from __future__ import annotations

from torch import nn

from kernellab.wholemodel.tracing import _trace
from kernellab.wholemodel.units import OptimizeError, Unit

# modules whose work is a library call (cuBLAS, cuDNN): fusion regions are cut between them
HEAVY = (nn.Linear, nn.Bilinear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d,
         nn.ConvTranspose3d, nn.MultiheadAttention, nn.RNNBase, nn.Embedding)
CONTAINERS = (nn.ModuleList, nn.ModuleDict)



def heavy_count(module: nn.Module) -> int:
    return sum(isinstance(m, HEAVY) for m in module.modules())


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def split(model: nn.Module, max_heavy: int = 4) -> list[Unit]:
    """The model's units, disjoint, in module order (see the module docstring for the rule)."""
    if max_heavy < 1:
        raise OptimizeError(f"max_heavy must be at least 1, got {max_heavy}")
    units: list[Unit] = []

    def visit(m: nn.Module, path: str) -> None:
        if isinstance(m, CONTAINERS):
            for name, c in m.named_children():
                visit(c, _join(path, name))
            return
        kids = list(m.named_children())
        if not kids or heavy_count(m) <= max_heavy:
            units.append(Unit(path, m))
            return
        if isinstance(m, nn.Sequential):
            regions(m, path, kids)
            return
        for name, c in kids:
            visit(c, _join(path, name))

    def regions(seq: nn.Sequential, path: str, kids: list[tuple[str, nn.Module]]) -> None:
        start = None
        for i, (name, c) in enumerate(kids):
            leaf = not list(c.children())
            if not leaf or isinstance(c, HEAVY):
                if start is not None:
                    units.append(Unit(path, seq, start, i))
                start = None
            if not leaf:  # a block of its own (a ResNet layer's blocks)
                visit(c, _join(path, name))
                continue
            if start is None:
                start = i
        if start is not None:
            units.append(Unit(path, seq, start, len(kids)))

    visit(model, "")
    for u in units:
        _trace(u)
    return units
