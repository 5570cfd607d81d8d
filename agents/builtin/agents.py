"""The rule-based roles: ``BuiltinAgents`` implements ``kernellab.agents.roles.Agents`` offline.

- **plan**: for each selected correct node, list the actions that apply to its groups, estimate each
  one's whole-model gain by Amdahl's law (the group's share of the time — from the reference
  profile's op times when they cover the model, else from roofline costs — times a per-action local
  speedup), drop actions already tried from that node, and propose the best ``k``.
- **code**: replay the parent's action list plus the proposal's action (``build``).
- **debug**: out of shared memory / registers -> smaller tiles; wrong results -> IEEE dot, then a
  two-pass reduction, then unfusing the row reduction, then cuBLAS; a compile or runtime error in one
  group -> split that group (a one-node group goes back to PyTorch).
- **analyze**: bound and % of ceiling from ncu metrics when there are some, else from counted bytes
  and FLOPs over the measured time; next ideas follow from the bound.
"""

from __future__ import annotations

import math
import re
from typing import Any

from kernellab.problem import Problem

from ..roles import Analysis, Code, Diagnosis, Proposal
from .actions import (
    Action,
    KeepRowOut,
    LibraryGemm,
    Persistent,
    Precision,
    ReductionMode,
    SetConfig,
    Split,
    SplitK,
    ToTorch,
    action_from_dict,
)
from .build import Built, build, built
from .codegen import allow_tf32, default_precision
from .cost import CEILING_BW, group_costs, peak_flops
from .loopgen import pointwise_defaults

__all__ = ["BuiltinAgents", "seed", "candidate_actions", "profile_reference"]

_SMS = 132  # H200 streaming multiprocessors: a GEMM grid smaller than this leaves SMs idle
# local speedup guesses per action kind (for Amdahl ranking only; the sandbox measures the truth)
_GUESS = {"split_k": 1.6, "persistent": 1.05, "precision": 2.0, "library_gemm": 1.3, "keep_row_out": 0.9,
          "reduction_mode": 1.05, "set_config": 1.03, "split": 0.9, "fuse": 1.2, "to_torch": 0.5}


def _actions_of(row: dict | None) -> list[dict] | None:
    if row is None:
        return []
    meta = row.get("meta") or {}
    acts = meta.get("actions")
    return list(acts) if isinstance(acts, list) else None


def _precision(problem: Problem, b: Built, grp) -> str | None:
    """The dot precision group ``grp`` runs with: its Precision action's, else the seed's rule."""
    return b.state.variant(grp.id).get("fp32_precision") or default_precision(b.graph, grp, problem.settings())


def _needs_ieee(problem: Problem, b: Built) -> bool:
    return any(g.kind == "gemm" and _precision(problem, b, g) == "ieee" for g in b.groups)


def seed(problem: Problem) -> list[Code]:
    """The fused Triton baseline; when a float32 GEMM must use IEEE dots (neither TF32 nor 3xTF32 fits
    the tolerances) also the cuBLAS-GEMM + fused-epilogue variant (cuBLAS fp32 beats an FMA-unit
    Triton GEMM)."""
    codes = [build(problem)]
    if _needs_ieee(problem, built(problem)):
        codes.append(build(problem, [LibraryGemm("*")]))
    return codes


def candidate_actions(problem: Problem, b: Built) -> list[tuple[Action, str]]:
    """(action, group id) pairs that apply to the candidate ``b``."""
    costs = {c.group: c for c in group_costs(b.graph, b.groups)}
    out: list[tuple[Action, str]] = []
    done = {a.describe() for a in b.actions}
    for grp in b.groups:
        c = costs.get(grp.id)
        variant = b.state.variant(grp.id)
        if grp.kind == "gemm" and c is not None:
            m, n, k = c.dims.get("M", 1), c.dims.get("N", 1), c.dims.get("K", 1)
            tiles = math.ceil(m / 128) * math.ceil(n / 128) * c.dims.get("B", 1)
            if not grp.row_reduction and tiles < _SMS and k >= 1024:
                out.append((SplitK(grp.id, 4 if k < 8192 else 8), grp.id))
            if tiles > 2 * _SMS and not variant.get("persistent"):
                out.append((Persistent(grp.id), grp.id))
            prec = _precision(problem, b, grp)
            if prec == "ieee":
                # tf32x3 is not proposed here: the tolerances do not admit it (codegen.tf32x3_ok), and
                # a win the sandbox's mixed-magnitude trial would reject is no win
                out.append((LibraryGemm(grp.gemm), grp.id))
            if grp.row_reduction:
                out.append((KeepRowOut(grp.id), grp.id))
            out.append((SetConfig(grp.id, (("GROUP_M", 16),), "tile ordering"), grp.id))
        elif grp.kind == "conv":  # cuDNN for the conv itself, its epilogue then one pointwise kernel
            out += [(LibraryGemm(grp.gemm), grp.id)] + ([(KeepRowOut(grp.id), grp.id)] if grp.row_reduction else [])
        elif grp.kind == "rows" and c is not None:
            r = c.dims.get("R", 1)
            mode = variant.get("mode", "auto")
            if mode != "multi_pass" and r > 1024:
                out.append((ReductionMode(grp.id, "multi_pass"), grp.id))
            if mode != "one_pass" and r > 8192:
                out.append((ReductionMode(grp.id, "one_pass"), grp.id))
        elif grp.kind == "pointwise":
            block = int((variant.get("config") or {}).get("BLOCK", pointwise_defaults(grp.domain)["BLOCK"]))
            if block < 4096:
                out.append((SetConfig(grp.id, (("BLOCK", 4096), ("num_warps", 8)), "vectorised loads"), grp.id))
            else:  # the seed is wide already: the other side of the rule
                out.append((SetConfig(grp.id, (("BLOCK", 1024), ("num_warps", 4)), "narrower blocks"), grp.id))
    return [(a, g) for a, g in out if a.describe() not in done]


def _shares(problem: Problem, b: Built, reference: dict) -> dict[str, float]:
    """Each group's share of the model's time."""
    costs = group_costs(b.graph, b.groups)
    total = sum(c.seconds for c in costs) or 1.0
    shares = {c.group: c.seconds / total for c in costs}
    ops = (reference or {}).get("ops") or []
    if ops:
        by_op: dict[str, float] = {}
        for o in ops:
            key = str(o.get("name", "")).split("::")[-1].split(".")[0]
            by_op[key] = by_op.get(key, 0.0) + float(o.get("share") or 0.0)
        meas: dict[str, float] = {}
        for grp in b.groups:
            names = {b.graph.node(n).origin.split(":")[0] or b.graph.node(n).op.split(".")[0] for n in grp.nodes}
            if grp.kind == "gemm":
                names |= {"mm", "addmm", "linear", "matmul", "bmm"}
            meas[grp.id] = sum(v for k, v in by_op.items() if k in names)
        covered = sum(meas.values())
        if covered >= 0.5:  # the profile explains most of the time: trust it over the roofline
            return {g: v / covered for g, v in meas.items()}
    return shares


class BuiltinAgents:
    """Offline planner, coder, debugger and analyst (no LLM, no network)."""

    name = "builtin"

    # -- plan -------------------------------------------------------------------------------------
    def plan(self, problem: Problem, tree: list[dict], k: int, reference: dict) -> list[Proposal]:
        if k <= 0:
            return []
        if not tree:
            props = [Proposal(None, "seed: fused Triton kernels", "capture, partition, one kernel per group")]
            if _needs_ieee(problem, built(problem)):
                props.append(Proposal(None, LibraryGemm("*").describe(),
                                      "fp32 GEMMs need IEEE dots: cuBLAS runs them faster than FMA-unit Triton",
                                      action=LibraryGemm("*").to_dict()))
            return props[:k]
        # a library-only node (cuBLAS for everything) has nothing of ours left to change: expand the
        # best node that runs kernels of its own instead, so the budget goes to kernel variants
        parents = [r for r in tree if r.get("selected") and not _library(r)]
        if not parents:
            parents = sorted((r for r in tree if _ok(r) and not _library(r)), key=lambda r: -(_speed(r) or 0))[:1]
        scored: list[tuple[float, Proposal]] = []
        for row in parents:
            if not _ok(row):
                continue
            acts = _actions_of(row)
            if acts is None:  # not a builtin candidate: nothing to replay
                continue
            tried = {_last_action_key(c) for c in tree if c.get("parent_id") == row["id"]}
            b = built(problem, acts)
            shares = _shares(problem, b, reference)
            hints = " ".join((row.get("analysis") or {}).get("next_ideas") or [])
            for action, gid in candidate_actions(problem, b):
                key = repr(sorted(action.to_dict().items()))
                if key in tried:
                    continue
                s = _GUESS.get(action.kind, 1.0)
                share = shares.get(gid, 0.0)
                gain = 1.0 / ((1.0 - share) + share / s)
                if action.kind in hints:  # the analyst asked for this kind of change
                    gain *= 1.05
                scored.append((gain, Proposal(row["id"], action.describe(),
                                              f"{gid} takes ~{share:.0%} of the time; expected local x{s:.2f}",
                                              expected_gain=round(gain, 3), action=action.to_dict())))
        scored.sort(key=lambda t: -t[0])
        return [p for _, p in scored[:k]]

    # -- code -------------------------------------------------------------------------------------
    def code(self, problem: Problem, proposal: Proposal, parent: dict | None) -> Code:
        acts = _actions_of(parent)
        if acts is None:
            raise ValueError("the parent is not a builtin candidate (no action list to replay)")
        if proposal.action:
            acts = acts + [action_from_dict(proposal.action).to_dict()]
        return build(problem, acts)

    # -- debug ------------------------------------------------------------------------------------
    def debug(self, problem: Problem, candidate: dict, evaluation: dict) -> Diagnosis:
        acts = _actions_of(candidate)
        if acts is None:
            return Diagnosis(None, "not a builtin candidate: no action list to repair")
        b = built(problem, acts)
        status = evaluation.get("status", "")
        text = f"{evaluation.get('error_class') or ''} {evaluation.get('error_text') or ''}"
        low = text.lower()
        done = {action_from_dict(a).describe() for a in acts}
        gids = [g.id for g in b.groups if g.kind != "torch"]
        named = [g for g in gids if re.search(rf"\b(k_)?{re.escape(g)}(_kernel|_one|_loop)?\b", text)]
        fix: Action | None = None
        why = ""
        if any(s in low for s in ("out of resource", "outofresources", "shared memory", "registers",
                                  "too many resources", "smem")):
            why = "out of shared memory/registers: smaller tiles"
            for gid in named or gids:
                fix = _smaller_tiles(b, gid)
                if fix is not None and fix.describe() not in done:
                    break
                fix = None
        elif status == "incorrect":
            why = "mismatch: more precise arithmetic"
            for cand in _precision_ladder(problem, b):
                if cand.describe() not in done:
                    fix, why = cand, f"mismatch: {cand.describe()}"
                    break
        elif status in ("compile_error", "runtime_error", "crash"):
            targets = named or gids[-1:]
            for gid in targets:
                grp = next(g for g in b.groups if g.id == gid)
                if grp.kind == "gemm" and grp.row_reduction:
                    fix = KeepRowOut(gid)
                elif len(grp.nodes) > 1:
                    fix = Split(grp.nodes[len(grp.nodes) // 2])
                else:
                    fix = ToTorch(grp.nodes[0])
                why = f"{status} in {gid}: split the group"
                if fix.describe() not in done:
                    break
                fix = None
        if fix is None:
            return Diagnosis(None, f"no rule applies to {status}: {text.strip()[:200]}")
        code = build(problem, acts + [fix.to_dict()])
        return Diagnosis(code.source, why, action=f"debug: {fix.describe()}", meta=code.meta)

    # -- analyze ----------------------------------------------------------------------------------
    def analyze(self, problem: Problem, candidate: dict, evaluation: dict, metrics: list[dict]) -> Analysis:
        acts = _actions_of(candidate) or []
        b = built(problem, acts)
        st = problem.settings()
        ideas: list[str] = []
        has_gemm = any(g.kind == "gemm" for g in b.groups)
        n_torch = sum(1 for g in b.groups if g.kind == "torch" and any(
            b.graph.node(n).kind == "opaque" for n in g.nodes))
        if metrics:
            by: dict[str, dict[str, float]] = {}
            for m in metrics:
                by.setdefault(m.get("kernel", ""), {})[m.get("name", "")] = float(m.get("value") or 0.0)
            total = sum(v.get("duration_ns", 0.0) for v in by.values()) or 1.0
            dram = sum(v.get("dram_throughput_pct", 0.0) * v.get("duration_ns", 0.0) for v in by.values()) / total
            sm = sum(v.get("sm_throughput_pct", 0.0) * v.get("duration_ns", 0.0) for v in by.values()) / total
            spills = sum(v.get("local_load_instructions", 0.0) for v in by.values())
            bound = "memory" if dram >= sm else "compute"
            if max(dram, sm) < 40:
                bound = "latency"
            pct = max(dram, sm)
            evidence = f"ncu: time-weighted DRAM {dram:.0f}% and SM {sm:.0f}% of peak over {len(by)} kernel(s)"
            if spills:
                evidence += f"; {spills:.0f} local loads (register spills)"
                ideas.append("set_config: smaller tiles (register spills)")
        else:
            ms = evaluation.get("median_ms")
            if not ms or evaluation.get("interpreted"):
                return Analysis("unknown", None, "no GPU timing (interpreted or missing): nothing to divide by",
                                ["time it on a GPU"])
            costs = group_costs(b.graph, b.groups, tf32=allow_tf32(st["dtype"], st["atol"], st["rtol"]))
            nbytes = sum(c.bytes for c in costs)
            flops = sum(c.flops for c in costs)
            secs = ms / 1e3
            bw = nbytes / secs / CEILING_BW
            peak = peak_flops(st["dtype"], allow_tf32(st["dtype"], st["atol"], st["rtol"]))
            if any(g.kind == "gemm" and _precision(problem, b, g) == "tf32x3" for g in b.groups):
                peak = peak_flops("float32", True) / 3  # three TF32 products per fp32 one
            fl = flops / secs / peak if has_gemm else flops / secs / peak_flops("float32")
            bound = "memory" if bw >= fl else "compute"
            pct = 100.0 * max(bw, fl)
            if pct < 30:
                bound = "latency"
            evidence = (f"counted {nbytes / 1e6:.1f} MB and {flops / 1e9:.2f} GFLOP in {ms:.3f} ms: "
                        f"{nbytes / secs / 1e12:.2f} TB/s ({100 * bw:.0f}% of 4.22) and "
                        f"{flops / secs / 1e12:.1f} TFLOP/s ({100 * fl:.0f}% of the {st['dtype']} ceiling)")
        if bound == "memory":
            ideas += ["fuse: fewer round trips to memory", "set_config: vectorised loads / wider blocks"]
            if any(g.kind == "rows" for g in b.groups):
                ideas.append("reduction_mode: one-pass rows keep the row in registers")
        elif bound == "compute":
            if has_gemm:
                ideas += ["split_k or persistent: fill the SMs", "set_config: larger GEMM tiles, tile ordering"]
                if st["dtype"] == "float32":
                    ideas.append("precision: tf32x3 runs fp32 GEMMs on tensor cores at ~fp32 accuracy")
        else:
            ideas += ["fuse: fewer kernel launches", "persistent: one program per SM"]
        if n_torch:
            ideas.append(f"{n_torch} op(s) still run in PyTorch between kernels")
        return Analysis(bound, round(pct, 1), evidence, ideas)


def _ok(row: dict) -> bool:
    best = row.get("best") or {}
    return best.get("status") == "correct"


def _library(row: dict) -> bool:
    return bool((row.get("best") or {}).get("library_only"))


def _speed(row: dict) -> float | None:
    return (row.get("best") or {}).get("speedup_eager")


def _last_action_key(row: dict) -> str | None:
    acts = _actions_of(row)
    if not acts:
        return None
    return repr(sorted(acts[-1].items()))


def _smaller_tiles(b: Built, gid: str) -> Action | None:
    grp = next((g for g in b.groups if g.id == gid), None)
    if grp is None:
        return None
    cur = (b.state.variant(gid).get("config") or {})
    if grp.kind in ("gemm", "conv"):
        bm, bn = int(cur.get("BLOCK_M", 128)), int(cur.get("BLOCK_N", 128))
        if bm <= 32 and bn <= 32:
            return None
        return SetConfig(gid, (("BLOCK_M", max(32, bm // 2)), ("BLOCK_N", max(32, bn // 2)), ("num_stages", 2)),
                         "smaller tiles")
    if grp.kind == "rows":
        tile, max_r = int(cur.get("TILE", 4096)), int(cur.get("MAX_R", 8192))
        if tile <= 256:
            return None
        return SetConfig(gid, (("TILE", tile // 2), ("MAX_R", max(512, max_r // 2)),
                               ("BLOCK_R", max(256, int(cur.get("BLOCK_R", 2048)) // 2))), "smaller tiles")
    block = int(cur.get("BLOCK", 1024))
    return SetConfig(gid, (("BLOCK", max(128, block // 2)),), "smaller tiles") if block > 128 else None


def _precision_ladder(problem: Problem, b: Built) -> list[Action]:
    out: list[Action] = []
    for g in b.groups:
        if g.kind == "gemm":
            dtype = b.graph.node(b.graph.node(g.gemm).args[0].name).dtype
            if dtype == "float32" and _precision(problem, b, g) in ("tf32", "tf32x3"):
                out.append(Precision(g.id, "ieee"))
    for g in b.groups:
        if g.kind == "conv" and b.state.variant(g.id).get("fp32_precision") != "ieee" \
                and b.graph.node(b.graph.node(g.gemm).args[0].name).dtype == "float32":
            out.append(Precision(g.id, "ieee"))
    for g in b.groups:
        if g.kind == "rows" and b.state.variant(g.id).get("mode") != "multi_pass":
            out.append(ReductionMode(g.id, "multi_pass"))
    for g in b.groups:
        if g.kind == "gemm" and g.row_reduction:
            out.append(KeepRowOut(g.id))
    for g in b.groups:
        if g.kind in ("gemm", "conv"):
            out.append(LibraryGemm(g.gemm))
    for g in b.groups:
        if g.kind in ("rows", "pointwise") and len(g.nodes) > 1:
            out.append(Split(g.nodes[len(g.nodes) // 2]))
    return out


def profile_reference(problem: Problem, device: str | None = None, small: bool | None = None,
                      reps: int = 5) -> dict[str, Any]:
    """The reference's op times with the torch profiler: ``{"ops": [{"name", "ms", "share"}],
    "eager_ms"}`` (device time on CUDA, CPU time otherwise), for ``plan``'s Amdahl ranking."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from kernellab.problem import instantiate

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    small = (device == "cpu") if small is None else small
    inst = instantiate(problem, small=small, seed=0, device=device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.no_grad():
        inst.model(*inst.inputs)
        if device == "cuda":
            torch.cuda.synchronize()
        with profile(activities=acts) as prof:
            for _ in range(reps):
                inst.model(*inst.inputs)
            if device == "cuda":
                torch.cuda.synchronize()
    rows = []
    for ev in prof.key_averages():
        t = ev.self_device_time_total if device == "cuda" else ev.self_cpu_time_total
        if t > 0 and ev.key.startswith("aten::"):
            rows.append((ev.key, t / reps / 1e3))
    total = sum(ms for _, ms in rows) or 1.0
    ops = [{"name": k, "ms": round(ms, 4), "share": round(ms / total, 4)} for k, ms in sorted(rows, key=lambda r: -r[1])]
    return {"ops": ops, "eager_ms": round(total, 4), "device": device}
