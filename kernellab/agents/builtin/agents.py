"""The rule-based roles: ``BuiltinAgents`` implements ``kernellab.agents.roles.Agents`` offline.

- **plan**: for each selected correct node, list the actions that apply to its groups with their
  expected whole-model gain (``planner.applicable_actions``: Amdahl's law over the group's share of
  the time — from the reference profile's op times when they cover the model, else from the cost
  model — and the cost model's local speedup), drop actions already tried from that node, and
  propose the best ``k``.
- **code**: replay the parent's action list plus the proposal's action (``build``).
- **debug**: out of shared memory / registers -> smaller tiles; wrong results -> IEEE dot (a conv judged
  on the GPU, whose fp32 reference is cuDNN TF32: ``tf32rn`` dots), then a
  two-pass reduction, then unfusing the row reduction, then cuBLAS / cuDNN; a compile or runtime error in one
  group -> split that group (a one-node group goes back to PyTorch).
- **analyze**: bound and % of ceiling from ncu metrics when there are some, else from counted bytes
  and FLOPs over the measured time; next ideas follow from the bound.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import Future
from typing import Any

from kernellab.compiler.codegen import allow_tf32, default_precision
from kernellab.compiler.cost import CEILING_BW, group_costs, peak_flops
from kernellab.problem import Problem
from kernellab.vocab import small_for

from ..roles import Analysis, Code, Diagnosis, Proposal
from .actions import (
    Action,
    KeepRowOut,
    LibraryGemm,
    Precision,
    ReductionMode,
    SetConfig,
    Split,
    ToTorch,
    action_from_dict,
)
from .build import Built, build, built
from .inductor import ACTION as INDUCTOR_ACTION
from .inductor import inductor_proposal, inductor_seed
from .planner import applicable_actions, library_conv_numerics, numerics_of_the_conv

__all__ = ["BuiltinAgents", "seed", "candidate_actions", "profile_reference"]



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


def _resolve(fut: Future, fn: Any, problem: Problem, kwargs: dict) -> None:
    try:
        fut.set_result(fn(problem, **kwargs))
    except BaseException as exc:  # the code step raises it, as it would have raised it itself
        fut.set_exception(exc)


def seed(problem: Problem) -> list[Code]:
    """The fused Triton baseline; when a float32 GEMM must use IEEE dots (neither TF32 nor 3xTF32 fits
    the tolerances) also the cuBLAS-GEMM + fused-epilogue variant (cuBLAS fp32 beats an FMA-unit
    Triton GEMM)."""
    codes = [build(problem)]
    if _needs_ieee(problem, built(problem)):
        codes.append(build(problem, [LibraryGemm("*")]))
    return codes


def candidate_actions(problem: Problem, b: Built) -> list[tuple[Action, str]]:
    """(action, group id) pairs that apply to the candidate ``b``, best expected gain first
    (``planner.applicable_actions`` has the gains)."""
    return [(x.action, x.group) for x in applicable_actions(problem, b)]


class BuiltinAgents:
    """Offline planner, coder, debugger and analyst (no LLM, no network). ``inductor``: ``{"device",
    "small"}`` to also seed from torch.compile's own code (``inductor.py``), None not to."""

    name = "builtin"

    def __init__(self, inductor: dict | None = None) -> None:
        self.inductor = inductor
        self._seeds: dict[str, Future] = {}
        self._seeds_lock = threading.Lock()
        self._proposed: set[str] = set()  # problems whose Inductor seed was proposed (once: a failed one is not retried)
        # problem id -> cuDNN's conv numerics as the last plan read them from the tree (_conv_numerics), for debug
        self._numerics: dict[str, str | None] = {}

    def prefetch(self, problems: list[Problem]) -> None:
        """Start the Inductor seeds' torch.compile now (a child process each, see ``inductor.py``), so
        that the 20-30 s compile runs while the campaign profiles the reference and plans, not after:
        ``code`` then waits only for what is left of it."""
        if self.inductor is not None:
            for p in problems:
                self._seed(p)

    def _seed(self, problem: Problem) -> Future:
        with self._seeds_lock:
            fut = self._seeds.get(problem.id)
            if fut is None:
                fut = self._seeds[problem.id] = Future()
                # a daemon thread: an interrupted campaign does not wait for a compile nobody will read
                threading.Thread(target=_resolve, args=(fut, inductor_seed, problem, self.inductor), daemon=True,
                                 name=f"kernellab-inductor-{problem.name}"[:60]).start()
        return fut

    # -- plan -------------------------------------------------------------------------------------
    def plan(self, problem: Problem, tree: list[dict], k: int, reference: dict) -> list[Proposal]:
        if k <= 0:
            return []
        # The Inductor seed joins the first round whose plan finds its compile done, at the latest the second:
        # waiting for it in the first held a solo campaign's first results 16-21 s (a cold torch.compile), with
        # the builtin seed evaluated, tuned and profiled meanwhile instead. The second round's first proposal, it
        # makes the same candidates as before (round one the seeds, round two the builtin seed's variants). It
        # waits only where the budget has room for it after the first round's seeds: k = min(width, budget left)
        # above their number leaves at least one.
        if not tree:
            props = [Proposal(None, "seed: fused Triton kernels", "capture, partition, one kernel per group")]
            if _needs_ieee(problem, built(problem)):
                props.append(Proposal(None, LibraryGemm("*").describe(),
                                      "fp32 GEMMs need IEEE dots: cuBLAS runs them faster than FMA-unit Triton",
                                      action=LibraryGemm("*").to_dict()))
            props[1:1] = self._inductor_now(problem, tree, may_wait=len(props) < k)
            return self._handed(problem, props[:k])
        inductor = self._inductor_now(problem, tree)
        # a library-only node (cuBLAS for everything) has nothing of ours left to change: expand the
        # best node that runs kernels of its own instead, so the budget goes to kernel variants
        # a node without an action list (the Inductor seed) has nothing to replay: the best one that has
        parents = [r for r in tree if r.get("selected") and not _library(r) and _actions_of(r) is not None]
        if not parents:
            parents = sorted((r for r in tree if _ok(r) and not _library(r) and _actions_of(r) is not None),
                             key=lambda r: -(_speed(r) or 0))[:1]
        # none runs kernels of its own: a library-only node whose conv our own kernel can take over (a Precision
        # pins it there), with those children alone. KernelBench's level-1 convolutions (cuDNN with nothing
        # after it) spent their budget on tuning variants of a conv that never ran (session 19: 8 of 14 misses)
        own_conv = not parents
        if own_conv:
            parents = sorted((r for r in tree if _ok(r) and _actions_of(r) is not None),
                             key=lambda r: -(_speed(r) or 0))[:1]
        numerics = self._numerics[problem.id] = _conv_numerics(tree)
        scored: list[tuple[float, Proposal]] = []
        for row in parents:
            if not _ok(row):
                continue
            acts = _actions_of(row)
            if acts is None:  # not a builtin candidate: nothing to replay
                continue
            tried = {_last_action_key(c) for c in tree if c.get("parent_id") == row["id"]}
            hints = " ".join((row.get("analysis") or {}).get("next_ideas") or [])
            # a parent judged in the interpreter was judged against the CPU's exact reference
            device = "cpu" if (row.get("best") or {}).get("interpreted") else None
            b = built(problem, acts)
            convs = {g.id for g in b.groups if g.kind == "conv"}
            for x in applicable_actions(problem, b, reference, device, numerics if device is None else None):
                key = repr(sorted(x.action.to_dict().items()))
                if key in tried or (own_conv and not (x.action.kind == "precision" and x.group in convs)):
                    continue
                gain = x.expected_gain
                if x.action.kind in hints:  # the analyst asked for this kind of change
                    gain *= 1.05
                scored.append((gain, Proposal(row["id"], x.text, x.reason, expected_gain=round(gain, 3),
                                              action=x.action.to_dict())))
        scored.sort(key=lambda t: -t[0])
        return self._handed(problem, (inductor + [p for _, p in scored])[:k])

    def _inductor_now(self, problem: Problem, tree: list[dict], may_wait: bool = False) -> list[Proposal]:
        """The Inductor seed's proposal for this round's plan, if any (see ``plan``): none once proposed, by
        this process or by the one that grew the tree (a resumed campaign's); ``may_wait``: none yet while its
        compile is under way."""
        if self.inductor is None or problem.id in self._proposed or any(
                r.get("origin") == "inductor" or "inductor" in (r.get("meta") or {}) for r in tree):
            return []
        if may_wait and not self._seed(problem).done():  # starts the compile if prefetch did not
            return []
        return [inductor_proposal()]

    def _handed(self, problem: Problem, props: list[Proposal]) -> list[Proposal]:
        if any((p.action or {}).get("kind") == INDUCTOR_ACTION for p in props):
            self._proposed.add(problem.id)
        return props

    # -- code -------------------------------------------------------------------------------------
    def code(self, problem: Problem, proposal: Proposal, parent: dict | None) -> Code:
        if (proposal.action or {}).get("kind") == INDUCTOR_ACTION:
            if self.inductor is None:
                raise ValueError("the Inductor seed is off for these agents")
            fut = self._seed(problem)
            try:
                return fut.result()
            finally:
                with self._seeds_lock:  # asked again (a resumed code step): compiled again
                    if self._seeds.get(problem.id) is fut:
                        del self._seeds[problem.id]
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
            # "interpreted" is False only for an evaluation that ran on CUDA
            on_gpu = evaluation.get("interpreted") is False
            for cand in _precision_ladder(problem, b, on_gpu, self._numerics.get(problem.id) if on_gpu else None):
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


def _precision_ladder(problem: Problem, b: Built, on_gpu: bool = False, conv_numerics: str | None = None) -> list[Action]:
    """The mismatch fixes in order. A conv group on the CPU gets IEEE dots (the CPU reference is exact
    fp32); on the GPU, where the fp32 reference conv is cuDNN in TF32, more accuracy moves away from it:
    ``tf32rn`` (cuDNN's rounding of the operands) instead, unless cuDNN's kernel was seen to be an fp32 one
    (``conv_numerics``, :func:`planner.library_conv_numerics`): IEEE dots then; cuDNN itself comes later either way."""
    out: list[Action] = []
    for g in b.groups:
        if g.kind == "gemm":
            dtype = b.graph.node(b.graph.node(g.gemm).args[0].name).dtype
            if dtype == "float32" and _precision(problem, b, g) in ("tf32", "tf32x3"):
                out.append(Precision(g.id, "ieee"))
    conv_fix = "tf32rn" if on_gpu and numerics_of_the_conv(b, conv_numerics) != "fp32" else "ieee"
    for g in b.groups:
        if g.kind == "conv" and b.state.variant(g.id).get("fp32_precision") != conv_fix \
                and b.graph.node(b.graph.node(g.gemm).args[0].name).dtype == "float32":
            out.append(Precision(g.id, conv_fix))
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
    small = small_for(device, small)
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


def _conv_numerics(tree: list[dict]) -> str | None:
    """What cuDNN's conv computed in for this problem on the GPU ("tf32"/"fp32"), read from the kernels of the
    tree's evaluations that ran it (the seed's: cuDNN's conv and our epilogue; Inductor's), None when none did or
    they disagree: the eager reference makes the same call, so it gets the same algorithm."""
    names = [k.get("name") or "" for r in tree if _ok(r) and not (r.get("best") or {}).get("interpreted")
             for k in ((r.get("best") or {}).get("details") or {}).get("kernels") or [] if not k.get("own")]
    return library_conv_numerics(names)
