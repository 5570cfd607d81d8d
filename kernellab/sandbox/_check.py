"""Correctness and integrity checks on tensors (run in the worker).

Trials draw inputs from several distributions, each derived from the problem's own ``get_inputs``
sample so that a problem whose inputs must stay positive (a log, a sqrt) keeps them positive:

- ``problem``: the problem's own sample;
- ``uniform``: uniform over the sample's own [min, max];
- ``large``:   the sample times :data:`LARGE_SCALE` (``atol`` scales with it, ``rtol`` does not);
- ``mixed``:   magnitudes spread over four decades, signs mixed when the sample has both signs.
"""

from __future__ import annotations

import math
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


_WORD = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def bits_of(flat: torch.Tensor) -> torch.Tensor:
    """A contiguous flat tensor's elements as integers of their width (bool and bytes widened to int64):
    what a print (:func:`bit_sums`) sums."""
    word = _WORD.get(flat.element_size())
    return flat.view(word) if word is not None and flat.dtype != torch.bool else flat.to(torch.int64)


_MOD = 1 << 64


def bit_sums(bits: torch.Tensor, lo: int, sums: tuple[int, int] = (0, 0)) -> tuple[int, int]:
    """``sums`` plus two sums of a chunk of :func:`bits_of` that starts at element ``lo``: plain and
    position-weighted, modulo 2**64 (int64 sums wrap, and wrap alike in any chunks: equal wherever and
    however they are computed)."""
    b = bits.to(torch.int64)
    w = torch.arange(lo, lo + b.numel(), device=b.device, dtype=torch.int64) % 65521 + 1
    return (sums[0] + int(b.sum())) % _MOD, (sums[1] + int((b * w).sum())) % _MOD


_CHUNK = 1 << 24  # elements compared at a time: full-size outputs (~1e9 elements) in float64 would
# need tens of GB next to the problem's own tensors; chunks keep the check's memory small and fixed.


def compare(ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float, sums: bool = False) -> dict[str, Any]:
    """Compare one output; returns a dict with ``ok``, ``error_class`` (when not ok), errors, and the
    first mismatched indices (Liger style: what a person debugging the kernel looks at first).
    ``ref`` may live on another device than ``out`` (a GPU worker keeps large reference outputs on the
    device where its grant allows, the others on the CPU): each chunk of it is moved to ``out``'s device.
    ``sums``: also ``ref_sums``, the reference's :func:`bit_sums` over the chunks compared, which the
    caller checks against the print taken when the reference was computed (the reference the candidate
    met is the one computed before it was loaded)."""
    shape = tuple(ref.shape)
    rflat, oflat = ref.detach().reshape(-1), out.detach().reshape(-1)
    n = rflat.numel()
    max_abs = max_rel = 0.0
    n_nf = n_close = 0
    first_nf: list[int] = []
    first_close: list[int] = []
    close_vals: list[tuple[float, float]] = []
    err_sq = ref_sq = 0.0
    ref_sums = (0, 0)
    for lo in range(0, max(n, 1), _CHUNK):
        o = oflat[lo:lo + _CHUNK].double()
        rc = rflat[lo:lo + _CHUNK].to(o.device)
        if rc.numel() == 0:
            break
        if sums:
            ref_sums = bit_sums(bits_of(rc), lo, ref_sums)
        r = rc.double()
        del rc
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
    if sums:
        res["ref_sums"] = ref_sums

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
    if not _norm_ok(err, denom, atol, rtol):
        res.update(ok=False, error_class="mismatch",
                   message=f"relative L2 error {rel_norm:.3g} exceeds {max(NORM_FACTOR * rtol, 1e-6):.3g}")
    return res


def _norm_ok(err: float, denom: float, atol: float, rtol: float) -> bool:
    """The relative-norm check of :func:`compare`: ``err`` and ``denom`` are the L2 norms of the
    difference and of the reference."""
    rel_norm = err / denom if denom > 0 else err
    return not (rel_norm > max(NORM_FACTOR * rtol, 1e-6) and err > atol)


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
# The anchor measures the candidate by the fp32 reference's distance from the fp64 one, so that distance must be
# rounding, not another computation: a forward that draws random numbers (dropout) may draw them differently in
# float64 (another kernel, another vector width), and the fp32 reference then sits O(1) away, which would admit
# any candidate within twice that. Rounding error stays far below this relative L2 norm (cuDNN's TF32 convs:
# about 1e-3) or within atol; past both the anchor does not vouch and the plain comparison stands.
ANCHOR_TRUST = 1e-2


def anchored(ref64: torch.Tensor, ref: torch.Tensor, out: torch.Tensor, atol: float, rtol: float) -> dict[str, Any]:
    """Judge ``out`` against the fp64 reference ``ref64``, by the fp32 reference ``ref``'s own error."""
    r64 = ref64.detach().reshape(-1)
    r32, o = ref.detach().reshape(-1), out.detach().reshape(-1)
    ref_err = cand_excess = err_sq = ref_sq = 0.0
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
        err_sq += float(((b - a) ** 2).sum())
        ref_sq += float((a ** 2).sum())
        cand_excess = max(cand_excess, float(((c - a).abs() - (atol + rtol * a.abs())).max()))
    rel = (err_sq / ref_sq) ** 0.5 if ref_sq > 0 else (0.0 if err_sq == 0 else math.inf)
    # (an fp32 reference within atol of the fp64 one everywhere is rounding too, at any norm: outputs of pure
    # rounding noise, whose fp64 values are exact zeros)
    trusted = finite and (rel <= ANCHOR_TRUST or ref_err <= atol)
    ok = trusted and cand_excess <= ANCHOR_FACTOR * ref_err
    return {"ok": ok, "ref_err_vs_fp64": ref_err, "cand_excess_vs_fp64": max(cand_excess, 0.0), "finite": finite,
            "ref_rel_norm_vs_fp64": rel, "trusted": trusted}


# -- null outputs ---------------------------------------------------------------------------------
# A trial whose reference a null output would pass judges nothing: KernelBench level2/30 at 8 channels
# in 8 groups normalises each channel alone, its outputs are ~1e-6, and a ModelNew returning zeros was
# `correct`. A null output is one that ignores the inputs: zeros, or one constant everywhere (the
# constant fixed per output across the trials: a value that changes with the inputs is computed).
# An output of one element is a constant whatever computes it, so only zeros are null there.
# A null output must miss by more than NULL_MARGIN times the tolerance for the trial to count: level2/62
# at one channel per group has outputs of rounding noise, ~1e-4 on the `mixed` trial, which zeros missed
# by a hair (and GroupNorm computed exactly, zeros, would have missed too).
NULL_MARGIN = 4.0


def trial_atol(atol: float, dist: str) -> float:
    """The absolute tolerance of a trial of distribution ``dist`` (``large`` scales it)."""
    return atol * (LARGE_SCALE if dist == "large" else 1.0)


def null_constant(ref: torch.Tensor, atol: float | None = None, rtol: float = 0.0) -> float:
    """The constant nearest to every finite element of ``ref`` (the middle of its range); NaN when
    it has no finite element, or, with ``atol``, as soon as the range is too wide for any constant to
    pass (so an informative full-size output costs one chunk, not a pass over all of it)."""
    if ref.is_complex() or ref.numel() == 0:
        return float("nan")
    lo, hi = float("inf"), float("-inf")
    flat = ref.detach().reshape(-1)
    for s in range(0, flat.numel(), _CHUNK):
        r = flat[s:s + _CHUNK].double()
        r = r[torch.isfinite(r)]
        if r.numel():
            lo, hi = min(lo, float(r.min())), max(hi, float(r.max()))
            # |r - c| <= atol + rtol |r| at both ends of the range needs this
            if atol is not None and hi - lo > 2 * atol + rtol * (abs(hi) + abs(lo)):
                return float("nan")
    return (lo + hi) / 2 if lo <= hi else float("nan")


def null_output(ref: torch.Tensor, atol: float, rtol: float, constant: float | None = None,
                device: torch.device | str | None = None) -> str | None:
    """Which null output :func:`compare` would pass against ``ref`` at NULL_MARGIN times the tolerance:
    ``"zeros"``, ``"the constant c"`` (``constant``, default :func:`null_constant` of ``ref``; never for
    one element), or None when neither would (the reference is informative). Chunked like ``compare``,
    on ``device`` when given."""
    if ref.is_complex():
        return None
    atol, rtol = atol * NULL_MARGIN, rtol * NULL_MARGIN
    c = null_constant(ref) if constant is None else constant
    test_c = ref.numel() > 1 and c == c and abs(c) != float("inf")
    flat = ref.detach().reshape(-1)
    zero_ok, c_ok = True, test_c
    z_sq = c_sq = 0.0
    for s in range(0, max(flat.numel(), 1), _CHUNK):
        r = flat[s:s + _CHUNK].to(device or flat.device).double()
        if r.numel() == 0:
            break
        if not bool(torch.isfinite(r).all()):  # a null output is finite, and must equal NaN/Inf there
            return None
        tol = atol + rtol * r.abs()
        zero_ok = zero_ok and not bool((r.abs() > tol).any())
        z_sq += float((r * r).sum())
        if c_ok:
            c_ok = not bool(((r - c).abs() > tol).any())
            c_sq += float(((r - c) ** 2).sum())
        if not (zero_ok or c_ok):
            return None
    if zero_ok and _norm_ok(z_sq ** 0.5, z_sq ** 0.5, atol, rtol):
        return "zeros"
    if c_ok and _norm_ok(c_sq ** 0.5, z_sq ** 0.5, atol, rtol):
        return f"the constant {c:.3g}"
    return None


def null_verdicts(refs: list[list[torch.Tensor]], atols: list[float], rtol: float,
                  device: torch.device | str | None = None) -> list[str | None]:
    """Per trial (its reference outputs ``refs[i]``, judged at ``atols[i]``): None when a null output
    fails it, else which null output would pass each output (``"output 0: zeros"``). A trial is
    informative when one of its outputs is: a null ModelNew is null in all of them."""
    consts = null_constants(refs[0], max(atols), rtol) if refs else []
    return [null_verdict(ref, atol, rtol, consts, device) for ref, atol in zip(refs, atols, strict=True)]


def null_constants(ref0: list[torch.Tensor], atol: float, rtol: float) -> list[float]:
    """The constants a null output is tried with, per output: from trial 0 (the problem's own inputs),
    its search bounded by the widest tolerance of the trials (``atol``)."""
    return [null_constant(r, NULL_MARGIN * atol, NULL_MARGIN * rtol) for r in ref0]


def null_verdict(ref: list[torch.Tensor], atol: float, rtol: float, consts: list[float],
                 device: torch.device | str | None = None) -> str | None:
    """One trial's entry of :func:`null_verdicts`: None when a null output fails it."""
    why = []
    for k, r in enumerate(ref):
        null = null_output(r, atol, rtol, consts[k] if k < len(consts) else None, device)
        if null is None:
            break
        why.append(f"output {k}: {null}")
    return None if len(why) < len(ref) or not ref else ", ".join(why)


def uninformative(verdicts: list[str | None], atol: float, rtol: float) -> str | None:
    """The reason a problem cannot judge a candidate when every trial's verdict says a null output
    passes (None when one trial is informative): one line, for ``error_text`` and for refusals."""
    if not verdicts or any(v is None for v in verdicts):
        return None
    return (f"the reference is uninformative: a null output passes every trial ({len(verdicts)}; "
            f"{verdicts[0]}, within {NULL_MARGIN:g}x atol={atol:g} rtol={rtol:g}), so a ModelNew returning it "
            "would be judged correct; the problem needs sizes at which its output varies (SMALL = {...})")


def judge_null(verdicts: list[str | None], atol: float, rtol: float, per_trial: list[dict]) -> str | None:
    """Given each trial's :func:`null_verdict` (computed with the reference outputs, on their device,
    before they went to the host: a pass over a full-size output on the host cost Softmax 100 s a job),
    records ``informative`` (and ``null_output``) in each trial's row of ``per_trial``; returns
    :func:`uninformative`'s reason when no trial is informative."""
    for row, v in zip(per_trial, verdicts, strict=False):
        row["informative"] = v is None
        if v is not None:
            row["null_output"] = v
    return uninformative(verdicts, atol, rtol)
