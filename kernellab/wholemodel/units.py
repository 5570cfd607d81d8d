"""The units a model is cut into, and the error of bad input to optimize/patch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn


class OptimizeError(ValueError):
    """Bad input to optimize/patch (one line)."""


@dataclass
class Unit:
    """One candidate subgraph: a submodule (``start is None``) or a slice ``[start:end]`` of a Sequential."""

    path: str  # the submodule's qualified name ("" is the model itself)
    module: nn.Module  # the submodule, or the Sequential the slice is taken from
    start: int | None = None
    end: int | None = None
    key: str | None = None  # structure key (None: not traceable)
    reason: str | None = None  # why it cannot be a problem
    traced: Any = field(default=None, repr=False)

    @property
    def label(self) -> str:
        base = self.path or "<model>"
        return base if self.start is None else f"{base}[{self.start}:{self.end}]"

    def body(self) -> nn.Module:
        """The unit as one module (a slice as a fresh Sequential of the same child objects)."""
        if self.start is None:
            return self.module
        return nn.Sequential(*list(self.module.children())[self.start:self.end])

    def first_last(self) -> tuple[nn.Module, nn.Module]:
        if self.start is None:
            return self.module, self.module
        kids = list(self.module.children())
        return kids[self.start], kids[self.end - 1]
