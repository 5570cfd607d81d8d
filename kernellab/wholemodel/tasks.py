"""Tasks: the deduplicated units' problems, ranked by their share of the model's time, and their campaigns."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kernellab.problem import Problem, ProblemError, content_hash
from kernellab.wholemodel.tracing import _exported, _flat_call
from kernellab.wholemodel.units import Unit
from kernellab.wholemodel.verify import unit_tolerance

PREFIX = "optimize"

# a unit's parameters above this many elements travel to the sandbox as seeded stand-ins (Problem.from_module):
# the winner is loaded with the real ones by patch(), and the end-to-end check runs on them
STAND_IN_ABOVE = 1 << 20


@dataclass
class Task:
    """One deduplicated problem: the units sharing a structure key and an input signature."""

    key: str  # structure key + signature: the campaign's name is made from it
    struct: str
    signature: tuple
    units: list[Unit]
    share: float
    problem: Problem | None = None
    call: str | None = None  # keyword and constant arguments (see _flat_call); None: positional tensors
    out: dict | None = None  # the output's structure when it is not one tensor (see _out_meta)
    aliases: dict | None = None  # the graph's lifted constants that are the unit's weights (see _aliases)
    tolerance: tuple[float, float] | None = None  # (atol, rtol) when not the default (see unit_tolerance)
    campaign: str | None = None
    outcome: str = ""
    budget: int = 0

    def record(self) -> dict:
        return {"key": self.key, "units": [u.label for u in self.units], "share": self.share,
                "campaign": self.campaign, "outcome": self.outcome, "budget": self.budget,
                "tolerance": list(self.tolerance) if self.tolerance else None,
                "signature": [[list(shape), dtype] for shape, dtype in self.signature]}


def _safe(name: str) -> str:
    return re.sub(r"[^\w.\-]+", "_", name).strip("_") or "model"


def make_tasks(model_name: str, units: list[Unit], prof: dict) -> tuple[list[Task], list[dict]]:
    """Group units into problems (dedupe), most promising first; and the units left to PyTorch, with why."""
    tasks: dict[str, Task] = {}
    skipped = []
    for u in units:
        share = prof["share"].get(u.label, 0.0)
        seen = prof["calls"].get(u.label) or []
        if u.key is None:
            skipped.append({"unit": u.label, "share": share, "reason": u.reason})
            continue
        if not seen:
            skipped.append({"unit": u.label, "share": share, "reason": "not called on the example inputs"})
            continue
        args, kwargs = seen[0]
        flat = _flat_call(args, kwargs)
        if flat is None or not flat[0]:
            skipped.append({"unit": u.label, "share": share, "reason": "called with no tensor, or with an argument "
                                                                       "that is neither a tensor nor None/bool/int/float/str"})
            continue
        tensors, sig, call = flat
        out = None
        # the fx graph takes the forward's own parameters; a call with keywords or constants is
        # exported on these very arguments instead, as a graph of its tensors only
        if u.traced is None or call is not None:
            exported = _exported(u, args, kwargs)
            if exported is None:
                skipped.append({"unit": u.label, "share": share, "reason": u.reason})
                continue
            u.traced, out = exported
        aliases = _aliases(u.traced, u.body())
        tol = unit_tolerance(u.body(), tensors[0].device.type)
        parts = [u.key, repr(sig), str(u.body().training)] + ([call] if call is not None else []) \
            + ([repr(tol)] if tol else [])
        key = content_hash(*parts, n=12)
        t = tasks.get(key)
        if t is None:
            t = tasks[key] = Task(key=key, struct=u.key, signature=sig, units=[], share=0.0, call=call, out=out,
                                  aliases=aliases, tolerance=tol)
        t.units.append(u)
        t.share += share
    ranked = []
    for t in sorted(tasks.values(), key=lambda t: -t.share):
        u = t.units[0]
        args = _flat_call(*prof["calls"][u.label][0])[0]
        # the mode of the unit, recorded as the problem's MODE: the graph's own root flag (from_module pickles a
        # copy of the graph, so the unit's modules are neither copied here nor moved)
        u.traced.training = u.body().training
        atol, rtol = t.tolerance or (None, None)
        try:
            t.problem = Problem.from_module(u.traced, [a.detach() for a in args], name=f"{_safe(model_name)}.{_safe(u.label)}",
                                            atol=atol, rtol=rtol, stand_in_above=STAND_IN_ABOVE)
        except ProblemError as exc:
            skipped += [{"unit": v.label, "share": t.share / len(t.units), "reason": str(exc)} for v in t.units]
            continue
        t.campaign = f"{PREFIX}/{_safe(model_name)}/{_safe(u.label)}-{t.key}"
        ranked.append(t)
    return ranked, skipped


def _aliases(graph: nn.Module, body: nn.Module) -> dict[str, str] | None:
    """Which of the graph's tensors that are not the unit's own names hold one of the unit's weights not
    otherwise in the graph, by value. torch.export lifts a tensor the forward reaches outside its module
    tree into a constant of the graph (KernelBench 44's ``mlpf`` is a lambda over the MLP's modules: its four
    weights become ``lifted_tensor_0..3``); :func:`patch` loads the unit's weights into those names. Equal
    weights (two LayerNorms at their init) may pair either way: the end-to-end check judges the result."""
    theirs, mine = graph.state_dict(), body.state_dict()
    ours = {k: v for k, v in mine.items() if k not in theirs}
    out: dict[str, str] = {}
    for k, v in theirs.items():
        if k in mine or not isinstance(v, torch.Tensor):
            continue
        for name, t in ours.items():
            if name not in out.values() and t.shape == v.shape and t.dtype == v.dtype \
                    and torch.equal(t.detach().to(v.device), v.detach()):
                out[k] = name
                break
    return out or None


def start_task(store: Any, task: Task, config: Any, *, max_heavy: int, model_name: str) -> str:
    """Create the task's campaign (named ``task.campaign``), its config carrying what :func:`patch`
    matches units by: structure key, input signature, mode, and the split it came from."""
    from kernellab import env
    from kernellab.campaign import start_campaign

    cid = start_campaign(store, config, name=task.campaign, problems=[task.problem])
    meta = {"key": task.key, "struct": task.struct, "signature": task.record()["signature"], "units": [u.label for u in task.units],
            "share": task.share, "max_heavy": max_heavy, "model": model_name,
            "training": task.units[0].body().training, "device": config.device or env.default_device(),
            "call": task.call, "out": task.out, "aliases": task.aliases}
    store.update_campaign(cid, config={**store.get_campaign(cid)["config"], "optimize": meta})
    return cid
