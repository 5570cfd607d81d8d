"""The builtin planner's action space: which actions apply to a candidate, and what each is expected to gain.

``applicable_actions(problem, candidate)`` lists every structural action that applies to a
candidate (a GEMM's split-K, persistent tiles, dot precision, cuBLAS; a row group's one- or two-pass
template, a split reduction for few long rows; moving a fusion boundary: split one op out of a group or fuse it back; a few named tile
presets), each with the cost model's expected whole-model gain. Tuning parameters (tile sizes,
warps, stages, vector width) are not actions: they sit in the candidate's SPACE with CONFIG
defaults, and the tuner explores them.

Expected gain: the candidate and its child are both modelled group by group (``cost.modelled_seconds``);
the action's local speedup is its group's modelled time over the same time plus the child's change,
and the whole-model gain is Amdahl's law over the group's share of the time, which comes from the
reference profile when one covers the model and from the model otherwise. Children that land on the
candidate's own state or on one of its ancestors' (undoing an earlier action) are not offered.

Precision rule: ``ieee`` is always offered where the candidate runs something else; ``tf32x3`` only
where ``codegen.tf32x3_ok`` admits it; plain ``tf32`` only where ``codegen.allow_tf32`` does (never
at fp32 1e-4). An fp32 conv group is also offered ``tf32rn`` (the TF32 rounding of cuDNN's conv, the
GPU reference's numerics); any Precision on a conv group pins our own conv where the seed's would
follow a cuDNN TF32 reference with cuDNN itself. A depthwise conv group (the FMA path, exact fp32 at any
precision) is offered ``ieee`` alone. Where an evaluation on the GPU showed which numerics cuDNN chose for the
problem's one conv (:func:`library_conv_numerics`: the eager reference runs the same call, so the same algorithm),
only the children that can match it are offered: ``tf32rn`` for a TF32 kernel, ``ieee``/``tf32x3`` for an fp32
one (KernelBench levels 1-2 on the H200: the other child was incorrect in 28 of 33 tries, and correct only where
the matching one was too).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from kernellab.compiler.codegen import (
    allow_tf32,
    auto_split_k,
    auto_split_r,
    conv_cin_g,
    conv_precision,
    default_precision,
    reads_weight,
    tf32x3_ok,
)
from kernellab.compiler.cost import modelled_seconds
from kernellab.compiler.ir import Graph
from kernellab.compiler.kernels.conv import DOT_MIN_N
from kernellab.compiler.kernels.loopgen import ONE_PASS_MAX_R, pointwise_defaults
from kernellab.compiler.partition import Group, partition
from kernellab.problem import Problem

from .actions import (
    Action,
    Fuse,
    KeepRowOut,
    LibraryGemm,
    Persistent,
    Precision,
    ReductionMode,
    SetConfig,
    Split,
    SplitK,
    State,
)
from .build import Built, built

__all__ = ["Applicable", "applicable_actions", "modelled_time", "group_shares"]

@dataclass(frozen=True)
class Applicable:
    """One action that applies to a candidate, with the cost model's estimate of what it gains."""

    action: Action
    group: str  # the group it changes (as partitioned in the candidate)
    share: float  # that group's share of the candidate's time
    local_speedup: float  # modelled: the group's time before / after
    expected_gain: float  # whole-model, Amdahl: 1 / ((1 - share) + share / local_speedup)
    reason: str = ""
    meta: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return self.action.describe()

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.to_dict(), "text": self.text, "group": self.group,
                "share": round(self.share, 4), "local_speedup": round(self.local_speedup, 4),
                "expected_gain": round(self.expected_gain, 4), "reason": self.reason}


def _as_built(problem: Problem, candidate: Any) -> Built:
    """A ``Built``, an action list, a ``Code`` or a tree row (``meta["actions"]``)."""
    if isinstance(candidate, Built):
        return candidate
    if candidate is None:
        return built(problem)
    meta = getattr(candidate, "meta", None)
    if meta is None and isinstance(candidate, dict):
        meta = candidate.get("meta")
    if meta is not None:
        acts = (meta or {}).get("actions")
        if not isinstance(acts, list):
            raise ValueError("not a builtin candidate: its meta has no action list to replay")
        return built(problem, acts)
    if isinstance(candidate, (list, tuple)):
        return built(problem, candidate)
    raise ValueError(f"applicable_actions: cannot read a candidate from {type(candidate).__name__}")


def _state_key(problem: Problem, graph: Graph, state: State) -> str:
    """What a candidate runs, with every default spelled out: two action lists that differ only by
    an explicit default (``mode="auto"``, split-K at the seed's rule) give one key."""
    opts = state.options
    groups = partition(graph, opts)
    eff = _effective_variants(graph, groups, state)
    for g in groups:
        if g.kind == "gemm":
            eff[g.id].setdefault("persistent", False)
            eff[g.id].setdefault("fp32_precision", _precisions(problem, graph, [g], state)[g.id])
        elif g.kind == "rows":
            eff[g.id].setdefault("mode", "auto")
            eff[g.id].setdefault("split_r", 1)
        elif g.kind == "pointwise":
            eff[g.id].setdefault("persistent", False)
    return json.dumps([sorted(opts.cuts), sorted(opts.torch_nodes), sorted(opts.no_row_fusion),
                       sorted(opts.library_gemm), eff], sort_keys=True, default=str)


def _precisions(problem: Problem, graph: Graph, groups: list[Group], state: State) -> dict[str, str | None]:
    """The dot precision of each GEMM group and each fp32 conv group (a seed conv: our own conv's, though
    on the GPU it may follow a TF32 reference with cuDNN: the model does not know the device)."""
    st = problem.settings()
    out = {g.id: (state.variant(g.id).get("fp32_precision") or default_precision(graph, g, st))
           for g in groups if g.kind == "gemm"}
    for g in groups:
        if g.kind == "conv" and graph.node(graph.node(g.gemm).args[0].name).dtype == "float32":
            out[g.id] = state.variant(g.id).get("fp32_precision") or conv_precision(graph, g, st)
    return out


def _effective_variants(graph: Graph, groups: list[Group], state: State) -> dict[str, dict]:
    """The variants as the generated code runs them (a GEMM's split-K and a rows group's split reduction
    default to the seed's rules)."""
    out = {}
    for g in groups:
        v = dict(state.variant(g.id))
        if g.kind == "gemm":
            v.setdefault("split_k", 1 if g.row_reduction else auto_split_k(graph, g))
        elif g.kind == "rows":
            v.setdefault("split_r", auto_split_r(graph, g))
        out[g.id] = v
    return out


def _model(problem: Problem, graph: Graph, state: State) -> tuple[list[Group], dict[str, float]]:
    groups = partition(graph, state.options)
    return groups, modelled_seconds(graph, groups, _effective_variants(graph, groups, state),
                                    _precisions(problem, graph, groups, state))


def modelled_time(problem: Problem, candidate: Any = None) -> float:
    """The cost model's time (seconds, on the reference H200) of a builtin candidate: a ranking key
    for when no GPU timing exists, never a measurement."""
    b = _as_built(problem, candidate)
    return sum(_model(problem, b.graph, b.state)[1].values())


def _op_key(name: str) -> str:
    """``aten::native_layer_norm.default`` -> ``layer_norm``: the profile's op as the graph's origin tags name it."""
    key = name.split("::")[-1].split(".")[0].lstrip("_")
    return key[len("native_"):] if key.startswith("native_") else key


def group_shares(problem: Problem, b: Built, reference: dict | None = None) -> dict[str, float]:
    """Each group's share of the candidate's time: from the reference profile's op times when they
    explain at least half of it (an op's time split over the groups that run it, in proportion to
    their modelled times), else from the cost model."""
    _, secs = _model(problem, b.graph, b.state)
    total = sum(secs.values()) or 1.0
    shares = {g: s / total for g, s in secs.items()}
    ops = (reference or {}).get("ops") or []
    if not ops:
        return shares
    names: dict[str, set[str]] = {}
    for grp in b.groups:
        ns = {_op_key(b.graph.node(n).origin.split(":")[0] or b.graph.node(n).op) for n in grp.nodes}
        if grp.kind == "gemm":
            # the profiler's names for the group's GEMM: a Linear runs as addmm/mm, a matmul as bmm/mm
            ns |= {"mm", "addmm", "linear"} if ns & {"linear", "addmm"} else {"mm", "matmul", "bmm"}
        names[grp.id] = ns
    meas = {g: 0.0 for g in names}
    for o in ops:
        owners = [g for g, ns in names.items() if _op_key(str(o.get("name", ""))) in ns]
        weight = sum(secs.get(g, 0.0) for g in owners)
        for g in owners:
            meas[g] += float(o.get("share") or 0.0) * (secs.get(g, 0.0) / weight if weight else 1 / len(owners))
    covered = sum(meas.values())
    if covered >= 0.5:  # the profile explains most of the time: trust it over the model
        return {g: v / covered for g, v in meas.items()}
    return shares


# -- proposals per group kind ----------------------------------------------------------------------

def _gemm_actions(problem: Problem, b: Built, grp: Group) -> list[Action]:
    st = problem.settings()
    gnode = b.graph.node(grp.gemm)
    a = b.graph.node(gnode.args[0].name)
    k = int(a.shape[-1]) if a.shape else 1
    variant = b.state.variant(grp.id)
    out: list[Action] = []
    if not grp.row_reduction:
        cur = int(variant.get("split_k", auto_split_k(b.graph, grp)))
        # one split-K child each way (the SPACE tunes SPLIT_K further); each split keeps at least two
        # BLOCK_K=32 steps of K
        wanted = [4 if k // 4 >= 64 else 2] if cur == 1 else [1, 2 * cur]
        out += [SplitK(grp.id, s) for s in wanted if s != cur and k // s >= 64]
    out.append(Persistent(grp.id, not variant.get("persistent", False)))
    dtype = a.dtype or "float32"
    if dtype == "float32":
        prec = variant.get("fp32_precision") or default_precision(b.graph, grp, st)
        allowed = ["ieee"]
        if tf32x3_ok(dtype, st["atol"], st["rtol"], k, reads_weight(b.graph, gnode)):
            allowed.append("tf32x3")
        if allow_tf32(dtype, st["atol"], st["rtol"]):
            allowed.append("tf32")
        out += [Precision(grp.id, p) for p in allowed if p != prec]
        if prec == "ieee":
            # cuBLAS fp32 runs at the full fp32 ceiling where an IEEE Triton dot reaches ~70% of it
            out.append(LibraryGemm(grp.gemm))
    if grp.row_reduction:
        out.append(KeepRowOut(grp.id))
    if grp.epilogue:  # move the fusion boundary: the epilogue becomes a pointwise kernel of its own
        out.append(Split(grp.epilogue[0]))
    gm = int((variant.get("config") or {}).get("GROUP_M", 8))
    out.append(SetConfig(grp.id, (("GROUP_M", 1 if gm > 8 else 16),), "tile ordering"))
    return out


# Library conv kernels by name (cuDNN's xmma and CUTLASS kernels, its older engines, PyTorch's depthwise), and the
# marks of TF32 tensor-core math among them: "tf32" in xmma names (tf32f32_tf32f32, f32f32_tf32f32), CUTLASS's
# s1688 (fp32 data on the m16n8k8 TF32 mma); an fp32 one (f32f32_f32f32, implicit_convolveNd_sgemm,
# convolveNd_dgrad_float_engine, dgrad_engine<float>) has neither.
_CONV_KERNEL_WORDS = ("fprop", "dgrad", "convolve", "conv_depthwise", "dgrad_engine")
_TF32_WORDS = ("tf32", "s1688")


def library_conv_numerics(kernel_names: list[str]) -> str | None:
    """"tf32" or "fp32": the math of the library conv kernels among ``kernel_names`` (an evaluation's, on the GPU),
    when they agree; None when none ran or they disagree."""
    seen = {("tf32" if any(w in n.lower() for w in _TF32_WORDS) else "fp32") for n in kernel_names
            if any(w in n.lower() for w in _CONV_KERNEL_WORDS)}
    return seen.pop() if len(seen) == 1 else None


def numerics_of_the_conv(b: Built, conv_numerics: str | None) -> str | None:
    """``conv_numerics`` where ``b`` has one conv group (the kernel names then belong to it), else None."""
    return conv_numerics if sum(g.kind == "conv" for g in b.groups) == 1 else None


def _conv_precisions(problem: Problem, b: Built, grp: Group, device: str | None = None,
                     conv_numerics: str | None = None) -> list[Action]:
    """Our own conv at a pinned dot precision. The seed's fp32 conv follows a cuDNN TF32 reference at call
    time (on the GPU by default: cuDNN's conv + our epilogue, ``codegen.CONV_ON_TF32_REFERENCE``); these
    children run our conv there instead: ``tf32rn`` reproduces the TF32 reference's products, ``tf32x3``
    and ``ieee`` suit an exact fp32 reference (the CPU's, or TF32 turned off). Judged on the CPU (``device``
    "cpu": the parent was judged in the interpreter) the reference conv is exact, and ``tf32rn`` would only spend a candidate.
    ``conv_numerics`` ("tf32"/"fp32", :func:`library_conv_numerics` of an evaluation on the GPU; used where the
    problem has this one conv): the reference's own, so only the children that can match it."""
    st = problem.settings()
    cnode = b.graph.node(grp.gemm)
    dtype = b.graph.node(cnode.args[0].name).dtype or "float32"
    if dtype != "float32":
        return []
    cur = b.state.variant(grp.id).get("fp32_precision")
    w = b.graph.node(cnode.args[1].name).shape or (1, 1)
    k = conv_cin_g(b.graph, cnode) * math.prod(w[2:])
    xs = b.graph.node(cnode.args[0].name).shape or (1, 1)
    groups = cnode.attrs["groups"] or max(1, int(xs[1]) // max(1, int(w[1])))  # 0: read from the shapes at run time
    cout_g = int(w[1]) if cnode.attrs["transposed"] else int(w[0]) // groups
    if cout_g < DOT_MIN_N:
        # a depthwise conv takes the FMA path, exact fp32 at every precision: one child pins our conv (KernelBench's
        # 83 and 85 spent two of their four candidates on a tf32rn and a tf32x3 child that were the same conv)
        return [Precision(grp.id, "ieee")] if cur != "ieee" else []
    conv_numerics = numerics_of_the_conv(b, conv_numerics)
    allowed = ["ieee"] if device == "cpu" else ["tf32rn"] if conv_numerics == "tf32" else \
        ["ieee"] if conv_numerics == "fp32" else ["tf32rn", "ieee"]
    if "ieee" in allowed and tf32x3_ok(dtype, st["atol"], st["rtol"], int(k), reads_weight(b.graph, cnode)):
        allowed.insert(allowed.index("ieee"), "tf32x3")
    if allow_tf32(dtype, st["atol"], st["rtol"]):
        allowed.append("tf32")
    return [Precision(grp.id, p) for p in allowed if p != cur]


def _compute_nodes(b: Built, grp: Group) -> list[str]:
    return [n for n in grp.nodes if b.graph.node(n).kind in ("pw", "reduce")]


def _rows_actions(b: Built, grp: Group, r: int) -> list[Action]:
    variant = b.state.variant(grp.id)
    mode = variant.get("mode", "auto")
    out: list[Action] = []
    # auto runs one pass up to MAX_R=8192: a different mode is only a different kernel beyond or below it
    if mode != "multi_pass" and r >= 512:
        out.append(ReductionMode(grp.id, "multi_pass"))
    if mode != "one_pass" and 8192 < r <= ONE_PASS_MAX_R:
        out.append(ReductionMode(grp.id, "one_pass"))
    if mode != "auto":
        out.append(ReductionMode(grp.id, "auto"))
    # few long rows are split by the seed (codegen.auto_split_r); their SPACE tunes SPLIT_R, 1 included
    nodes = _compute_nodes(b, grp)
    reds = [i for i, n in enumerate(nodes) if b.graph.node(n).kind == "reduce"]
    if reds and reds[0] > 0:  # a prologue: it becomes a pointwise kernel that writes its result
        out.append(Split(nodes[reds[0]]))
    if reds and reds[-1] + 1 < len(nodes):  # an epilogue after the last reduction
        out.append(Split(nodes[reds[-1] + 1]))
    return out


def _pointwise_actions(b: Built, grp: Group) -> list[Action]:
    cfg = b.state.variant(grp.id).get("config") or {}
    block = int(cfg.get("BLOCK", pointwise_defaults(grp.domain)["BLOCK"]))
    out: list[Action] = []
    if block < 4096:
        out.append(SetConfig(grp.id, (("BLOCK", 4096), ("num_warps", 8)), "vectorised loads"))
    if block > 1024:  # the seed is wide already: the other side of the rule
        out.append(SetConfig(grp.id, (("BLOCK", 1024), ("num_warps", 4)), "narrower blocks"))
    out.append(Persistent(grp.id, not b.state.variant(grp.id).get("persistent", False)))
    nodes = _compute_nodes(b, grp)
    if len(nodes) >= 2:
        out.append(Split(nodes[len(nodes) // 2]))
    return out


def _proposals(problem: Problem, b: Built, device: str | None = None,
               conv_numerics: str | None = None) -> list[tuple[Action, str]]:
    out: list[tuple[Action, str]] = []
    dims = {}
    for grp in b.groups:
        if grp.kind == "rows":
            dims[grp.id] = math.prod(grp.domain[d] for d in grp.red_dims)
    for grp in b.groups:
        if grp.kind == "gemm":
            out += [(a, grp.id) for a in _gemm_actions(problem, b, grp)]
        elif grp.kind == "rows":
            out += [(a, grp.id) for a in _rows_actions(b, grp, dims[grp.id])]
        elif grp.kind == "pointwise":
            out += [(a, grp.id) for a in _pointwise_actions(b, grp)]
        elif grp.kind == "conv":  # cuDNN for the conv itself (its epilogue then one pointwise kernel)
            out += [(LibraryGemm(grp.gemm), grp.id)] + ([(KeepRowOut(grp.id), grp.id)] if grp.row_reduction else [])
            out += [(a, grp.id) for a in _conv_precisions(problem, b, grp, device, conv_numerics)]
    # fusion boundaries moved back: a split or a PyTorch fallback of an earlier action
    owner = {n: g.id for g in b.groups for n in g.nodes}
    for node in sorted(b.state.options.cuts | b.state.options.torch_nodes):
        if node in owner:
            out.append((Fuse(node), owner[node]))
    return out


def applicable_actions(problem: Problem, candidate: Any = None, reference: dict | None = None,
                       device: str | None = None, conv_numerics: str | None = None) -> list[Applicable]:
    """Every action that applies to ``candidate`` (a ``Built``, an action list, a ``Code`` or a tree row;
    None for the seed), best expected gain first. Each child is a different candidate: actions that
    change nothing or return to an ancestor's state are left out. ``conv_numerics``: what the library's conv
    computed in on the GPU (:func:`library_conv_numerics`), for the conv precisions offered."""
    b = _as_built(problem, candidate)
    state = State()
    seen = {_state_key(problem, b.graph, state)}
    for a in b.actions:
        state = a.apply(state)
        seen.add(_state_key(problem, b.graph, state))
    _, before = _model(problem, b.graph, b.state)
    shares = group_shares(problem, b, reference)
    total = sum(before.values()) or 1.0
    out: list[Applicable] = []
    for action, gid in _proposals(problem, b, device, conv_numerics):
        child = action.apply(b.state)
        key = _state_key(problem, b.graph, child)
        if key in seen:
            continue
        seen.add(key)
        _, after = _model(problem, b.graph, child)
        delta = sum(after.values()) - total
        t_g = before.get(gid, 0.0) or 1e-9
        local = t_g / max(t_g + delta, 1e-12)
        share = shares.get(gid, 0.0)
        gain = 1.0 / ((1.0 - share) + share / local)
        out.append(Applicable(action, gid, share, local, gain,
                              f"{gid} takes ~{share:.0%} of the time; modelled local x{local:.2f}"))
    out.sort(key=lambda x: -x.expected_gain)
    return out
