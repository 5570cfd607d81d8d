"""Replayable actions: every builtin candidate is its parent plus one action (the tree's edges).

An action is a frozen dataclass; ``apply(state)`` returns a new :class:`State` (partition options and
per-group variants), so a candidate is rebuilt exactly by replaying its list from the seed
(``build.build(problem, actions)``). ``to_dict``/``action_from_dict`` give the JSON form stored in
``Code.meta["actions"]`` and in ``Proposal.action``. Group ids (``g_<first node>``) name the group
as partitioned when the action was chosen; a variant whose group no longer exists is ignored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, ClassVar

from kernellab.compiler.partition import Options

__all__ = ["State", "Action", "Split", "Fuse", "ToTorch", "LibraryGemm", "KeepRowOut", "ReductionMode",
           "SplitK", "SplitRows", "Persistent", "Precision", "SetConfig", "action_from_dict", "ACTIONS"]


@dataclass(frozen=True)
class State:
    options: Options = field(default_factory=Options)
    variants: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()

    def variant(self, gid: str) -> dict:
        for g, items in self.variants:
            if g == gid:
                out: dict[str, Any] = {}
                for k, v in items:
                    if k == "config":
                        out.setdefault("config", {}).update(dict(v))
                    else:
                        out[k] = v
                return out
        return {}

    def variants_dict(self) -> dict[str, dict]:
        return {g: self.variant(g) for g, _ in self.variants}

    def with_variant(self, gid: str, key: str, value: Any) -> State:
        cur = dict(self.variants)
        items = [kv for kv in cur.get(gid, ()) if kv[0] != key or key == "config"]
        items.append((key, value))
        cur[gid] = tuple(items)
        return replace(self, variants=tuple(cur.items()))


class Action:
    kind: ClassVar[str] = ""

    def apply(self, state: State) -> State:  # pragma: no cover - abstract
        raise NotImplementedError

    def describe(self) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)  # type: ignore[call-overload]
        for k, v in d.items():
            if isinstance(v, tuple):
                d[k] = [list(x) if isinstance(x, tuple) else x for x in v]
        return {"kind": self.kind, **d}


def _opts(state: State, **kw: Any) -> State:
    return replace(state, options=replace(state.options, **kw))


@dataclass(frozen=True)
class Split(Action):
    """Start a new group at ``node`` (no fusion with its producers)."""

    kind: ClassVar[str] = "split"
    node: str

    def apply(self, state: State) -> State:
        return _opts(state, cuts=state.options.cuts | {self.node})

    def describe(self) -> str:
        return f"split the fusion group at {self.node}"


@dataclass(frozen=True)
class Fuse(Action):
    """Undo a split or a PyTorch fallback at ``node``."""

    kind: ClassVar[str] = "fuse"
    node: str

    def apply(self, state: State) -> State:
        return _opts(state, cuts=state.options.cuts - {self.node}, torch_nodes=state.options.torch_nodes - {self.node})

    def describe(self) -> str:
        return f"fuse {self.node} with its producers again"


@dataclass(frozen=True)
class ToTorch(Action):
    """Run ``node`` with PyTorch (the debugger's last resort for a group that will not compile)."""

    kind: ClassVar[str] = "to_torch"
    node: str

    def apply(self, state: State) -> State:
        return _opts(state, torch_nodes=state.options.torch_nodes | {self.node})

    def describe(self) -> str:
        return f"leave {self.node} to PyTorch"


@dataclass(frozen=True)
class LibraryGemm(Action):
    """Run a GEMM (``node``, or ``*`` for all) with cuBLAS; its epilogue becomes a pointwise kernel."""

    kind: ClassVar[str] = "library_gemm"
    node: str = "*"

    def apply(self, state: State) -> State:
        return _opts(state, library_gemm=state.options.library_gemm | {self.node})

    def describe(self) -> str:
        return f"cuBLAS GEMM ({'all' if self.node == '*' else self.node}) + fused epilogue kernel"


@dataclass(frozen=True)
class KeepRowOut(Action):
    """Do not fuse the row reduction into GEMM group ``group`` (it gets its own rows kernel)."""

    kind: ClassVar[str] = "keep_row_out"
    group: str

    def apply(self, state: State) -> State:
        return _opts(state, no_row_fusion=state.options.no_row_fusion | {self.group})

    def describe(self) -> str:
        return f"unfuse the row reduction from {self.group}"


@dataclass(frozen=True)
class ReductionMode(Action):
    """Rows group template: ``one_pass`` (whole row in registers), ``multi_pass`` (loop over the row
    once per reduction level, two passes for softmax), or ``auto`` (by row length)."""

    kind: ClassVar[str] = "reduction_mode"
    group: str
    mode: str

    def __post_init__(self) -> None:
        if self.mode not in ("auto", "one_pass", "multi_pass"):
            raise ValueError(f"reduction mode {self.mode!r} is not auto, one_pass or multi_pass")

    def apply(self, state: State) -> State:
        return state.with_variant(self.group, "mode", self.mode)

    def describe(self) -> str:
        return f"{self.mode.replace('_', '-')} reduction in {self.group}"


@dataclass(frozen=True)
class SplitK(Action):
    kind: ClassVar[str] = "split_k"
    group: str
    k: int

    def apply(self, state: State) -> State:
        return state.with_variant(self.group, "split_k", int(self.k))

    def describe(self) -> str:
        return f"split-K {self.k} in {self.group}"


@dataclass(frozen=True)
class SplitRows(Action):
    """Split reduction: each long row of ``group`` is cut into ``parts`` chunks reduced by programs of
    their own, then the partials are combined (few rows would otherwise leave the GPU idle)."""

    kind: ClassVar[str] = "split_rows"
    group: str
    parts: int

    def __post_init__(self) -> None:
        if int(self.parts) < 1:
            raise ValueError(f"split_rows parts must be >= 1, not {self.parts!r}")

    def apply(self, state: State) -> State:
        return state.with_variant(self.group, "split_r", int(self.parts))

    def describe(self) -> str:
        return f"split reduction ({self.parts} chunks a row) in {self.group}" if self.parts > 1 else \
            f"one program a row in {self.group}"


@dataclass(frozen=True)
class Persistent(Action):
    """About one program per SM (a GEMM) or four (a pointwise group) walks the tiles, or back to one
    program per tile."""

    kind: ClassVar[str] = "persistent"
    group: str
    on: bool = True

    def apply(self, state: State) -> State:
        return state.with_variant(self.group, "persistent", bool(self.on))

    def describe(self) -> str:
        return f"{'persistent' if self.on else 'one-tile-per-program'} kernel in {self.group}"


PRECISIONS = ("ieee", "tf32", "tf32x3", "tf32rn")


@dataclass(frozen=True)
class Precision(Action):
    """fp32 dot precision of a GEMM or conv group: ``ieee``, ``tf32``, ``tf32x3`` (3-pass TF32, ~fp32
    accuracy) or, for a conv group, ``tf32rn`` (operands rounded to TF32 to nearest, as cuDNN's TF32 conv
    rounds them). On a conv group it also pins the group to our own conv wherever it runs (the seed's
    follows a TF32 cuDNN reference at call time: ``codegen.CONV_ON_TF32_REFERENCE``)."""

    kind: ClassVar[str] = "precision"
    group: str
    precision: str

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not {', '.join(PRECISIONS)}")

    def apply(self, state: State) -> State:
        return state.with_variant(self.group, "fp32_precision", self.precision)

    def describe(self) -> str:
        return f"{self.precision} dot in {self.group}"


@dataclass(frozen=True)
class SetConfig(Action):
    """Change default tile parameters of ``group``: smaller tiles after a resource error, wider
    blocks for vectorised loads, GROUP_M tile ordering. ``why`` is the label shown in the tree."""

    kind: ClassVar[str] = "set_config"
    group: str
    values: tuple[tuple[str, Any], ...]
    why: str = ""

    def apply(self, state: State) -> State:
        return state.with_variant(self.group, "config", tuple(self.values))

    def describe(self) -> str:
        vals = ", ".join(f"{k}={v}" for k, v in self.values)
        return f"{self.why or 'config'} in {self.group} ({vals})"


ACTIONS: dict[str, type] = {c.kind: c for c in (Split, Fuse, ToTorch, LibraryGemm, KeepRowOut, ReductionMode,
                                               SplitK, SplitRows, Persistent, Precision, SetConfig)}


def action_from_dict(d: dict[str, Any]) -> Action:
    """The action of a stored dict (``Action.to_dict`` form); raises ValueError on an unknown kind."""
    if not isinstance(d, dict) or d.get("kind") not in ACTIONS:
        raise ValueError(f"not a builtin action: {d!r}")
    cls = ACTIONS[d["kind"]]
    kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
    if cls is SetConfig:
        kw["values"] = tuple((k, v) for k, v in kw.get("values", ()))
    return cls(**kw)
