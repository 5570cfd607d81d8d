"""Patching: a copy of the model whose units run their winner's ``ModelNew``, PyTorch elsewhere."""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from kernellab import _runtime
from kernellab.wholemodel.patched import _Fast, _install
from kernellab.wholemodel.profiling import _call, _hooks
from kernellab.wholemodel.splitting import split
from kernellab.wholemodel.tracing import _flat_call
from kernellab.wholemodel.units import OptimizeError, Unit
from kernellab.wholemodel.verify import _verify


def _entries(store: Any) -> dict[tuple, dict]:
    """(structure key, signature, training) -> the campaign holding its winner, for every optimize campaign."""
    out: dict[tuple, dict] = {}
    for camp in store.list_campaigns():
        meta = (camp.get("config") or {}).get("optimize")
        if not meta:
            continue
        sig = tuple((tuple(s[0]), s[1]) for s in meta["signature"])
        out[(meta["struct"], sig, bool(meta["training"]), meta.get("call"))] = {**meta, "campaign": camp}
    return out


# a winner re-timed less than this much faster than eager stays PyTorch: on the H200, BERT-base's output
# block won at 1.02x alone in the sandbox, and patched into the model's twelve layers it took a larger
# share of the model's time than PyTorch had (31% against 18%; the model 7.95 ms against eager's 7.61)
MIN_PATCH_SPEEDUP = 1.05


def _load_winner(store: Any, entry: dict, unit: Unit, require_speedup: bool,
                 min_speedup: float = 1.0) -> tuple[nn.Module | None, dict]:
    from kernellab.export import load_best

    camp = entry["campaign"]
    info: dict[str, Any] = {"campaign": camp["name"]}
    best = store.reported_best(camp["id"])
    if not best:
        return None, {**info, "reason": "no correct candidate"}
    e = best[0]
    info.update(candidate=e["candidate_id"], interpreted=bool(e["interpreted"]), speedup_eager=e["speedup_eager"])
    if require_speedup and not e["interpreted"] and not (e["speedup_eager"] or 0) >= min_speedup:
        return None, {**info, "reason": f"the winner is not enough faster than PyTorch ({e['speedup_eager']:.3g}x eager; "
                                        f"a patch needs {min_speedup:g}x)"}
    try:
        cls = load_best(store, camp["id"])
        fast = cls()  # a from_module problem's Model takes no arguments
        # export (a unit fx cannot trace, or a call with keywords) keeps the unit's own names
        src = unit.traced if unit.traced is not None and entry.get("call") is None else unit.body()
        own = src.state_dict()
        aliases = entry.get("aliases") or {}
        state = {f"inner.{k}": v for k, v in own.items() if k not in aliases.values()}
        state.update({f"inner.{k}": own[v] for k, v in aliases.items() if v in own})
        missing, unexpected = fast.load_state_dict(state, strict=False)
        # constants torch.export lifted out of the forward stay as they are; every weight must load
        params = {n for n, _ in fast.named_parameters()}
        missing = [k for k in missing if k in params]
        if missing or unexpected:
            return None, {**info, "reason": f"the winner's weights do not match the unit's ({len(missing)} missing, "
                                            f"{len(unexpected)} unexpected)"}
        ref = next(iter([*unit.body().parameters(), *unit.body().buffers()]), None)
        if ref is not None:
            fast = fast.to(device=ref.device, dtype=ref.dtype if ref.is_floating_point() else None)
        fast.train(unit.body().training)
    except Exception as exc:  # untrusted code: any failure keeps PyTorch for the unit
        return None, {**info, "reason": f"loading the winner failed: {type(exc).__name__}: {str(exc)[:200]}"}
    return fast, info


def patch(model: nn.Module, db: Any, example_inputs: list | tuple | None = None, *, require_speedup: bool = True,
          min_speedup: float | None = None, atol: float | None = None, rtol: float | None = None,
          check_trials: int = 3) -> nn.Module:
    """A copy of ``model`` whose units found in ``db`` (campaigns of :func:`optimize`, matched by
    structure key, input shapes and mode) run their winner's ``ModelNew`` with the unit's own weights;
    every other unit, and a unit whose winner is not correct (or, timed on a GPU, not ``min_speedup``
    times faster than eager when ``require_speedup``; default :data:`MIN_PATCH_SPEEDUP`), stays PyTorch.
    A patched unit falls back to its PyTorch forward for other input shapes, another mode
    (``.train()``/``.eval()``), another device, or when autograd needs a graph (the kernels compute a
    forward only). ``state_dict`` keys are those of the model.

    **Trust**: a winner is candidate code, judged in the sandbox but loaded here into your own process,
    unsandboxed. Calling ``patch`` is the choice to run it.

    With ``example_inputs`` the patched model is checked end to end against the model on fresh inputs
    (their shapes, new random values; in the model's own mode, dropout reseeded alike) within
    ``atol``/``rtol`` (default 1e-3 for fp32, 2e-2 for half types). A unit whose winner fails its own
    check on those inputs goes back to PyTorch; ``patched.kernellab_check`` records the outcome and
    ``patched.kernellab_patches`` each unit's."""
    _runtime.setup()  # the interpreter switch and the ast lock, before any work (kernellab._runtime)
    from kernellab.store import Store

    if not isinstance(model, nn.Module):
        raise OptimizeError(f"model is a {type(model).__name__}, not a torch.nn.Module")
    store = db if hasattr(db, "reported_best") else Store(str(db))
    entries = _entries(store)
    patched = copy.deepcopy(model)
    records: list[dict] = []
    fasts: list[tuple[Unit, _Fast]] = []
    heavies = sorted({e["max_heavy"] for e in entries.values()})
    inputs = list(example_inputs) if example_inputs is not None else None
    calls: dict[str, list] = {}
    if inputs is not None:  # each unit's arguments in the model, recorded on a copy (buffers stay as they are)
        probe = copy.deepcopy(patched)
        with _hooks([u for h in heavies for u in split(probe, h)], {}, calls):
            _call(probe, inputs, seed=0)
    seen: set[str] = set()
    for h in heavies:
        for u in split(patched, h):
            if u.key is None or u.label in seen:
                continue
            training = u.body().training
            sigs = [f[1:] for f in (_flat_call(*c) for c in calls.get(u.label, [])) if f is not None] \
                if inputs is not None else None
            matches = [e for (k, s, tr, c), e in entries.items() if k == u.key and tr == training
                       and (sigs is None or (s, c) in sigs)]
            if not matches:
                continue
            seen.add(u.label)
            entry = matches[0]
            sig = tuple((tuple(s[0]), s[1]) for s in entry["signature"])
            fast, info = _load_winner(store, entry, u, require_speedup,
                                      MIN_PATCH_SPEEDUP if min_speedup is None else min_speedup)
            rec = {"unit": u.label, **info}
            if fast is None:
                records.append({**rec, "status": "pytorch"})
                continue
            records.append({**rec, "status": "kernel"})
            names = "region" if u.start is not None else "leaf" if u.traced is not None and entry.get("call") is None \
                and not list(u.module.children()) else "module"
            fasts.append((u, _Fast(fast, sig, training, entry.get("device") or "cpu", info, names, u.start or 0,
                                   entry.get("call"), entry.get("out"))))
    for u, fast in fasts:
        _install(u, fast)
    patched.kernellab_patches = records
    patched.kernellab_check = None
    if inputs is not None and fasts:
        patched.kernellab_check = _verify(model, patched, inputs, fasts, records, atol, rtol, check_trials)
    return patched
