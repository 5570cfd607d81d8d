"""Verification: the tolerances, fresh inputs, and the end-to-end check of a patched model."""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from kernellab.wholemodel.patched import _uninstall
from kernellab.wholemodel.profiling import _call, _hooks

# fp32 errors of several kernels compound through the model: the end-to-end check is looser than a
# subgraph's own (1e-4), tighter than fp16's
E2E_TOL = {torch.float32: (1e-3, 1e-3), torch.float16: (2e-2, 2e-2), torch.bfloat16: (2e-2, 2e-2)}


CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)


def unit_tolerance(body: nn.Module, device: str) -> tuple[float, float] | None:
    """The (atol, rtol) a unit is judged at when not the default 1e-4: on CUDA, fp32 convolutions run in
    cuDNN in TF32 (``torch.backends.cudnn.allow_tf32``, on by default), about 5e-4 relative per product. A
    candidate whose activations between two such convs differ from the reference's by one ulp (a BatchNorm
    reduced in another order) has the second conv round its inputs otherwise: KernelBench 8's block, both
    seeds, 688 of 32M outputs off by 1.2e-4 on the H200 (session 8). A unit chaining two or more is judged at
    the end-to-end tolerance, which the whole patched model must meet anyway."""
    convs = [m for m in body.modules() if isinstance(m, CONVS)]
    if device != "cuda" or len(convs) < 2 or not torch.backends.cudnn.allow_tf32:
        return None
    if not all(p.dtype == torch.float32 for c in convs for p in c.parameters()):
        return None
    return E2E_TOL[torch.float32]


def fresh_inputs(inputs: list, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            out.append(torch.randn(x.shape, generator=g, dtype=torch.float32).to(device=x.device, dtype=x.dtype))
        else:
            out.append(x.clone() if isinstance(x, torch.Tensor) else x)
    return out


def _outputs(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _outputs(o)]
    if isinstance(out, dict):
        return [t for o in out.values() for t in _outputs(o)]
    return []


def _close(a: Any, b: Any, atol: float, rtol: float) -> tuple[bool, float]:
    xs, ys = _outputs(a), _outputs(b)
    if len(xs) != len(ys) or not xs:
        return False, math.inf
    worst = 0.0
    ok = True
    for x, y in zip(xs, ys, strict=True):
        if x.shape != y.shape:
            return False, math.inf
        x, y = x.detach().float().cpu(), y.detach().float().cpu()
        if not torch.isfinite(y).all() and torch.isfinite(x).all():
            return False, math.inf
        worst = max(worst, float((x - y).abs().max()) if x.numel() else 0.0)
        ok = ok and bool(torch.allclose(y, x, atol=atol, rtol=rtol, equal_nan=True))
    return ok, worst


def _verify(model: nn.Module, patched: nn.Module, inputs: list, fasts: list, records: list,
            atol: float | None, rtol: float | None, trials: int) -> dict:
    """The patched model against the model on fresh inputs; a unit whose winner disagrees with its own
    PyTorch forward on the inputs it gets there is put back to PyTorch first."""
    dtype = next((x.dtype for x in inputs if isinstance(x, torch.Tensor) and x.is_floating_point()), torch.float32)
    d_atol, d_rtol = E2E_TOL.get(dtype, (1e-3, 1e-3))
    atol, rtol = d_atol if atol is None else atol, d_rtol if rtol is None else rtol
    by_label = {r["unit"]: r for r in records}
    # per unit: the winner against the unit's PyTorch forward on the arguments it gets in the model
    for u, fast in fasts:
        calls: dict[str, list] = {}
        with _hooks([u], {}, calls):
            _call(copy.deepcopy(patched), fresh_inputs(inputs, 1000), seed=0)
        bad = None
        for args, kwargs in calls.get(u.label, [])[:2]:
            with torch.no_grad():  # as the model was called: autograd off, so the winner's path is taken
                tensors = fast.take(u.module, args, kwargs)
            if tensors is None:
                continue
            ref_body = copy.deepcopy(u.body())
            if u.start is None:  # the class's own forward, not the patched one
                ref_body.__dict__.pop("_kernellab_fast", None)
            want = _call(ref_body, list(args), seed=1, kwargs=kwargs)
            torch.manual_seed(1)
            with torch.no_grad():
                got = fast.run(tensors)
            ok, err = _close(want, got, atol, rtol)
            if not ok:
                bad = f"incorrect in the model (max abs err {err:.3g})"
                break
        if bad:
            _uninstall(u)
            by_label[u.label].update(status="pytorch", reason=bad)
    worst = 0.0
    for trial in range(trials):
        x = fresh_inputs(inputs, 2000 + trial)
        ref = copy.deepcopy(model)  # training-mode buffers (BatchNorm statistics) stay as they were
        pat = copy.deepcopy(patched)
        ok, err = _close(_call(ref, x, seed=trial), _call(pat, x, seed=trial), atol, rtol)
        worst = max(worst, err)
        if not ok:
            for u, _ in fasts:
                _uninstall(u)
                if by_label[u.label]["status"] == "kernel":
                    by_label[u.label].update(status="pytorch", reason="end-to-end check failed")
            return {"ok": False, "trials": trial + 1, "max_abs_err": err, "atol": atol, "rtol": rtol,
                    "mode": "train" if model.training else "eval",
                    "note": "the end-to-end check failed: every unit runs PyTorch"}
    return {"ok": True, "trials": trials, "max_abs_err": worst, "atol": atol, "rtol": rtol,
            "mode": "train" if model.training else "eval"}
