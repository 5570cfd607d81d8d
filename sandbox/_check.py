"""Correctness and integrity checks on tensors (run in the worker).

Trials draw inputs from several distributions, each derived from the problem's own ``get_inputs``
sample so that a problem whose inputs must stay positive (a log, a sqrt) keeps them positive:

- ``problem``: the problem's own sample;
- ``uniform``: uniform over the sample's own [min, max];
- ``large``:   the sample times :data:`LARGE_SCALE` (``atol`` scales with it, ``rtol`` does not);
- ``mixed``:   magnitudes spread over four decades, signs mixed when the sample has both signs.
"""

from __future__ import annotations

from typing import Any

import torch

DISTRIBUTIONS = ("problem", "uniform", "large", "mixed")
LARGE_SCALE = 16.0
# A candidate may differ from the reference by this relative L2 norm (times rtol, floor 1e-6) at most:
# it catches outputs that are slightly wrong everywhere but pass allclose thanks to atol.
NORM_FACTOR = 1.0
_FIRST_BAD = 5


def distribution(trial: int) -> str:
    return DISTRIBUTIONS[trial % len(DISTRIBUTIONS)]


def transform(inputs: list, dist: str, gen: torch.Generator) -> list:
    out = []
    for x in inputs:
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()) or dist == "problem" or x.numel() == 0:
            out.append(x)
            continue
        x32 = x.float()
        if dist == "uniform":
            lo, hi = float(x32.min()), float(x32.max())
            # in place: at full size on the device every temporary is another input's worth of memory
            y = torch.rand(x.shape, generator=gen, device=gen.device).to(x.device).mul_(hi - lo).add_(lo)
        elif dist == "large":
            y = x32 * LARGE_SCALE
        elif dist == "mixed":
            mag = torch.rand(x.shape, generator=gen, device=gen.device).mul_(4).sub_(3)
            mag = torch.pow(10.0, mag, out=mag)  # 1e-3 .. 10
            sign = torch.rand(x.shape, generator=gen, device=gen.device).sub_(0.5)  # negative: half of them
            y = mag.copysign_(sign).to(x.device)
            del sign
            if float(x32.min()) >= 0:
                y = y.abs_()
        else:  # pragma: no cover - guarded by DISTRIBUTIONS
            raise ValueError(dist)
        out.append(y.to(x.dtype))
    return out


def clone_all(inputs: list) -> list:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def modified_inputs(before: list, after: list) -> list[int]:
    """Indices of tensor inputs whose contents changed (bitwise, NaN equal to NaN)."""
    bad = []
    for i, (a, b) in enumerate(zip(before, after, strict=False)):
        if isinstance(a, torch.Tensor):
            if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(_bits(a), _bits(b)):
                bad.append(i)
    return bad


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if t.is_floating_point() and t.element_size() in (2, 4, 8):
        return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def _span(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + max(st.nbytes(), 1)


def overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device != b.device:
        return False
    a0, a1 = _span(a)
    b0, b1 = _span(b)
    return a0 < b1 and b0 < a1


_CHUNK = 1 << 24  # elements compared at a time: full-size outputs (~1e9 elements) in float64 would
# need tens of GB next to the problem's own tensors; chunks keep the check's memory small and fixed.


def compare(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> dict[str, Any]:
    """Compare one output; returns a dict with ``ok``, ``error_class`` (when not ok), errors, and the
    first mismatched indices (Liger style: what a person debugging the kernel looks at first).
    ``ref`` may live on another device than ``out`` (the worker keeps reference outputs on the CPU):
    each chunk of it is moved to ``out``'s device."""
    shape = tuple(ref.shape)
    rflat, oflat = ref.detach().reshape(-1), out.detach().reshape(-1)
    n = rflat.numel()
    max_abs = max_rel = 0.0
    n_nf = n_close = 0
    first_nf: list[int] = []
    first_close: list[int] = []
    close_vals: list[tuple[float, float]] = []
    err_sq = ref_sq = 0.0
    for lo in range(0, max(n, 1), _CHUNK):
        o = oflat[lo:lo + _CHUNK].double()
        r = rflat[lo:lo + _CHUNK].to(o.device).double()
        if r.numel() == 0:
            break
        r_fin, o_fin = torch.isfinite(r), torch.isfinite(o)
        # NaN/Inf rule: where the reference is finite, the candidate must be finite; where it is not,
        # the candidate must hold the same non-finite value (NaN where NaN, +Inf where +Inf).
        bad_nf = (r_fin & ~o_fin) | (~r_fin & ~((torch.isnan(r) & torch.isnan(o)) | (r == o)))
        both = r_fin & o_fin
        diff = torch.where(both, (r - o).abs(), torch.zeros_like(r))
        # relative to |reference| + atol, so that elements near zero do not report huge ratios
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / (r.abs() + atol)).max()))
        bad_close = both & (diff > atol + rtol * r.abs())
        k = int(bad_nf.sum())
        if k:
            n_nf += k
            if len(first_nf) < _FIRST_BAD:
                first_nf += (bad_nf.nonzero().flatten()[:_FIRST_BAD] + lo).tolist()
        k = int(bad_close.sum())
        if k:
            n_close += k
            if len(first_close) < _FIRST_BAD:
                idx = bad_close.nonzero().flatten()[:_FIRST_BAD - len(first_close)]
                first_close += (idx + lo).tolist()
                close_vals += [(float(r[i]), float(o[i])) for i in idx.tolist()]
        err_sq += float(torch.where(both, (r - o) ** 2, torch.zeros_like(r)).sum())
        ref_sq += float(torch.where(both, r * r, torch.zeros_like(r)).sum())
    res: dict[str, Any] = {"ok": True, "max_abs_err": max_abs, "max_rel_err": max_rel}

    def unravel(flat: list[int]) -> list[list[int]]:
        if not shape:
            return [[] for _ in flat]
        return [[int(v) for v in t] for t in zip(*torch.unravel_index(torch.tensor(flat), shape), strict=True)]

    if n_nf:
        idx = unravel(first_nf[:_FIRST_BAD])
        res.update(ok=False, error_class="nan", first_bad=idx,
                   message=f"{n_nf} non-finite values where the reference differs (first at {idx})")
        return res
    if n_close:
        idx = unravel(first_close[:_FIRST_BAD])
        vals = close_vals[:_FIRST_BAD]
        res.update(ok=False, error_class="mismatch", first_bad=idx, first_bad_values=vals,
                   mismatched=n_close, total=n,
                   message=f"{n_close}/{n} elements differ beyond atol={atol:g} rtol={rtol:g}; "
                           f"first at {idx} (reference, candidate) = {vals[:3]}")
        return res
    err, denom = err_sq ** 0.5, ref_sq ** 0.5
    rel_norm = err / denom if denom > 0 else err
    res["rel_norm"] = rel_norm
    if rel_norm > max(NORM_FACTOR * rtol, 1e-6) and err > atol:
        res.update(ok=False, error_class="mismatch",
                   message=f"relative L2 error {rel_norm:.3g} exceeds {max(NORM_FACTOR * rtol, 1e-6):.3g}")
    return res


def check_structure(ref: list[torch.Tensor], out: Any, device: torch.device | None = None) -> tuple[str, str] | None:
    """(error_class, message) when count, shape, dtype or device of the outputs differ; ``device``:
    where the outputs belong when the reference outputs are kept elsewhere."""
    from kernellab.problem import output_tensors

    outs = output_tensors(out)
    if outs is None:
        return "type", f"ModelNew.forward returned {type(out).__name__}, not a tensor or a tuple of tensors"
    if len(outs) != len(ref):
        return "count", f"{len(outs)} outputs, the reference returns {len(ref)}"
    for i, (r, o) in enumerate(zip(ref, outs, strict=False)):
        if tuple(r.shape) != tuple(o.shape):
            return "shape", f"output {i} has shape {tuple(o.shape)}, the reference {tuple(r.shape)}"
        if r.dtype != o.dtype:
            return "dtype", f"output {i} has dtype {o.dtype}, the reference {r.dtype}"
        want = device if device is not None else r.device
        if want != o.device:
            return "device", f"output {i} is on {o.device}, the reference on {want}"
    return None


# On the synthetic distributions (uniform, large, mixed) a problem can be far worse conditioned than
# on its own sample: a GEMM whose operand was scaled by 1/sqrt(K) gets O(10) outputs from ``uniform``,
# and attention's logits grow with the square of ``large``'s scale. There the fp32 reference carries
# rounding error of the size of the tolerance itself, and a second correct fp32 summation order
# differs from it by about as much. So when a candidate misses the fp32 reference on such a trial,
# both are judged against the reference computed in fp64: the candidate passes when its excess over
# the tolerance is at most ANCHOR_FACTOR times the fp32 reference's own error. The ``problem`` trial
# (KernelBench's own inputs) is never anchored: there the plain allclose decides.
ANCHOR_FACTOR = 2.0


def anchored(ref64: torch.Tensor, ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> dict[str, Any]:
    """Judge ``out`` against the fp64 reference ``ref64``, by the fp32 reference ``ref``'s own error."""
    r64 = ref64.detach().reshape(-1)
    r32, o = ref.detach().reshape(-1), out.detach().reshape(-1)
    ref_err = cand_excess = 0.0
    finite = True
    for lo in range(0, max(r64.numel(), 1), _CHUNK):
        a = r64[lo:lo + _CHUNK].double()
        if a.numel() == 0:
            break
        b = r32[lo:lo + _CHUNK].double().to(a.device)
        c = o[lo:lo + _CHUNK].double().to(a.device)
        if not (bool(torch.isfinite(a).all()) and bool(torch.isfinite(c).all())):
            finite = False
            break
        ref_err = max(ref_err, float((b - a).abs().max()))
        cand_excess = max(cand_excess, float(((c - a).abs() - (atol + rtol * a.abs())).max()))
    ok = finite and cand_excess <= ANCHOR_FACTOR * ref_err
    return {"ok": ok, "ref_err_vs_fp64": ref_err, "cand_excess_vs_fp64": max(cand_excess, 0.0), "finite": finite}
