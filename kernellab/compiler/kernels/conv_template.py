# ruff: noqa: E501 - the templates are the generated Triton lines, verbatim
"""The implicit-GEMM convolution kernel as Triton template text (``template.render`` fills the ``{{HOLES}}``;
``conv.py`` says what goes in each and its module docstring why the kernel looks the way it does). A program
computes one [BLOCK_M pixels, BLOCK_N channels] tile of one channel group ``g``: tile order, pixel coordinates,
then the K loop over the (ci, kd, kh, kw) taps gathering the input (ordinary, transposed or sub-pixel
transposed), or cuDNN's output loaded in its place (``LIBRARY``), then the epilogue and one of three stores."""

from __future__ import annotations

__all__ = ["KERNEL", "SUBPIXEL_PHASE", "SUBPIXEL_PIXELS", "SUBPIXEL_TAPS", "PIXELS", "TAPS", "STORE_OUTPUT",
           "STORE_POOLED", "STORE_CHANNEL_REDUCED", "FINISH", "TF32_RNA", "TAP_INPUT"]

# Holes: HELPERS (the epilogue, TF32 rounding and transposed-input functions), KERNEL, PARAMS; TAP_INPUT (the last's name); GEMM_ROWS (M: every output pixel,
# or the sub-pixel phase's); PIXEL_BLOCKS (pixel blocks: per sample when the spatial dims are reduced);
# GROUP_ROWS; OFFS_M (the tile's pixels) and MASK_PHASE (sub-pixel only); PIXEL_COORDS (od, oh, ow, nb);
# TAP_COUNT (KTOT) and TAP_COORDS (kd, kh, kw, ci of the K block; the sub-pixel phase's taps computed there);
# DOT (the fp32 or half dot); LOAD_OPERANDS, EPILOGUE; STORE.
KERNEL = """\
{{HELPERS}}
@triton.jit
def {{KERNEL}}(
    {{PARAMS}}
):
    pid = tl.program_id(0)
    g = tl.program_id(1)
    {{GEMM_ROWS}}
    S = OD * OH * OW
    {{PIXEL_BLOCKS}}
    num_pid_n = tl.cdiv(COUT_G, BLOCK_N)
    # grouped ordering: GROUP_M pixel blocks sweep the channel blocks together (weight reuse in L2)
    group_span = GROUP_M * num_pid_n
    first_m = (pid // group_span) * GROUP_M
    {{GROUP_ROWS}}
    pid_m = first_m + (pid % group_span) % group_rows
    pid_n = (pid % group_span) // group_rows
    {{OFFS_M}}
    {{MASK_PHASE}}
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < COUT_G
    {{PIXEL_COORDS}}
    if BIG:
        nb = nb.to(tl.int64)
    x_base = nb * sxn + (g * CIN_G) * sxc
    co = g * COUT_G + offs_n
    {{TAP_COUNT}}
    if LIBRARY:
        # cuDNN ran the conv (the launcher passes its output as x, with its strides): load it
        y_off = (nb * sxn + od * sxd + oh * sxh + ow * sxw)[:, None] + co[None, :] * sxc
        acc = tl.load(x_ptr + y_off, mask=mask_m[:, None] & mask_n[None, :], other=0.0).to(tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if not TRANSPOSED:
            id0 = od * SD - PD
            ih0 = oh * SH - PH
            iw0 = ow * SW - PW
            pix0 = x_base + id0 * sxd + ih0 * sxh + iw0 * sxw
        if TAP_MAJOR:
            # one step per (tap, block of input channels), channels innermost: a tap's input pixel and its
            # bounds are vectors of BLOCK_M, and the [BLOCK_M, BLOCK_K] gather costs one add per element
            NCB = tl.cdiv(CIN_G, BLOCK_K)
            if SUBPIX:
                NSTEPS = TD * TH * TW * NCB  # this phase's taps only
            else:
                NSTEPS = KD * KH * KW * NCB
        else:
            NSTEPS = tl.cdiv(KTOT, BLOCK_K)
        for kk in range(0, NSTEPS):
            if TAP_MAJOR:
                tap = kk // NCB
                ci = (kk % NCB) * BLOCK_K + tl.arange(0, BLOCK_K)
                mask_k = ci < CIN_G
                if SUBPIX:
                    kw = kw0 + SW * (tap % TW)
                    kh = kh0 + SH * ((tap // TW) % TH)
                    kd = kd0 + SD * (tap // (TW * TH))
                else:
                    kw = tap % KW
                    kh = (tap // KW) % KH
                    kd = tap // (KW * KH)
                if SUBPIX:
                    # o + p - k is a multiple of s by the choice of k (exact division, negative or not)
                    idd = (od + PD - kd) // SD
                    ih = (oh + PH - kh) // SH
                    iw = (ow + PW - kw) // SW
                    okm = (idd >= 0) & (idd < ID) & (ih >= 0) & (ih < IH) & (iw >= 0) & (iw < IW)
                    w_off = (g * CIN_G + ci)[:, None] * sw0 + offs_n[None, :] * sw1
                elif TRANSPOSED:
                    idd, okd = {{TAP_INPUT}}(od, kd, PD, DD, SD, ID)
                    ih, okh = {{TAP_INPUT}}(oh, kh, PH, DH, SH, IH)
                    iw, okw = {{TAP_INPUT}}(ow, kw, PW, DW, SW, IW)
                    okm = okd & okh & okw
                    w_off = (g * CIN_G + ci)[:, None] * sw0 + offs_n[None, :] * sw1
                else:
                    idd = id0 + kd * DD
                    ih = ih0 + kh * DH
                    iw = iw0 + kw * DW
                    okm = (idd >= 0) & (idd < ID) & (ih >= 0) & (ih < IH) & (iw >= 0) & (iw < IW)
                    w_off = co[None, :] * sw0 + ci[:, None] * sw1
                w_off = w_off + (kd * swd + kh * swh + kw * sww)
                pix = x_base + idd * sxd + ih * sxh + iw * sxw
                a = tl.load(x_ptr + pix[:, None] + ci[None, :] * sxc, mask=(mask_m & okm)[:, None] & mask_k[None, :], other=0.0)
            else:
                offs_k = kk * BLOCK_K + tl.arange(0, BLOCK_K)
                mask_k = offs_k < KTOT
                {{TAP_COORDS}}
                if TRANSPOSED:
                    if not SUBPIX:
                        idd, okd = {{TAP_INPUT}}(od[:, None], kd[None, :], PD, DD, SD, ID)
                        ih, okh = {{TAP_INPUT}}(oh[:, None], kh[None, :], PH, DH, SH, IH)
                        iw, okw = {{TAP_INPUT}}(ow[:, None], kw[None, :], PW, DW, SW, IW)
                        ok = okd & okh & okw
                        w_off = (g * CIN_G + ci)[:, None] * sw0 + offs_n[None, :] * sw1
                    w_off = w_off + (kd * swd + kh * swh + kw * sww)[:, None]
                    x_off = x_base[:, None] + ci[None, :] * sxc + idd * sxd + ih * sxh + iw * sxw
                    amask = mask_m[:, None] & mask_k[None, :] & ok
                else:
                    # the input offset is the pixel's (made before the loop) plus the tap's, a vector each; a dim
                    # with no padding never leaves the input (the output size is what fits), so it is not checked
                    x_off = pix0[:, None] + (ci * sxc + (kd * DD) * sxd + (kh * DH) * sxh + (kw * DW) * sxw)[None, :]
                    amask = mask_m[:, None] & mask_k[None, :]
                    if PD > 0:
                        q = id0[:, None] + (kd * DD)[None, :]
                        amask = amask & (q >= 0) & (q < ID)
                    if PH > 0:
                        q = ih0[:, None] + (kh * DH)[None, :]
                        amask = amask & (q >= 0) & (q < IH)
                    if PW > 0:
                        q = iw0[:, None] + (kw * DW)[None, :]
                        amask = amask & (q >= 0) & (q < IW)
                    w_off = co[None, :] * sw0 + (ci * sw1 + kd * swd + kh * swh + kw * sww)[:, None]
                a = tl.load(x_ptr + x_off, mask=amask, other=0.0)
            b = tl.load(w_ptr + w_off, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
            if USE_DOT:
                if UPCAST:  # the interpreter's bf16 dot multiplies raw bits; a bf16 product is exact in fp32
                    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
                else:
                    {{DOT}}
            else:
                # channel blocks narrower than a dot tile (depthwise): outer products, exact fp32 FMAs
                acc += tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], axis=1)
    # epilogue operands: broadcast views of the output shape, indexed by (n, c, d, h, w) strides
    {{LOAD_OPERANDS}}
    {{EPILOGUE}}
    {{STORE}}
"""

# sub-pixel transposed conv: the output's phase (o mod s per dim) is the fastest-varying part of program_id(0);
# in one phase the valid taps are k = k0 + s*t, so no tap is visited in vain, and the input pixel is j - t + const.
# The phases of one tile run side by side: they read the same input pixels and fill the same output sectors
# (o and o+1 of a row are two phases). With the phases outermost (a grid axis of their own) ncu measured, on the
# H200, 2_ConvTranspose2d reading 8.6 GB for a 0.54 GB input and writing 4.3 GB for a 2.15 GB output
SUBPIXEL_PHASE = """\
cls = pid % (SD * SH * SW)
pid = pid // (SD * SH * SW)
rw = cls % SW
rh = (cls // SW) % SH
rd = cls // (SW * SH)
QD = tl.maximum(tl.cdiv(OD - rd, SD), 0)
QH = tl.maximum(tl.cdiv(OH - rh, SH), 0)
QW = tl.maximum(tl.cdiv(OW - rw, SW), 0)
M = NB * QD * QH * QW
"""

PIXELS = """\
ow = offs_m % OW
t = offs_m // OW
oh = t % OH
t = t // OH
od = t % OD
nb = t // OD
"""

SUBPIXEL_PIXELS = """\
ow = rw + SW * (offs_m % QW)
t = offs_m // QW
oh = rh + SH * (t % QH)
t = t // QH
od = rd + SD * (t % QD)
nb = t // QD
"""

TAPS = """\
kw = offs_k % KW
tk = offs_k // KW
kh = tk % KH
tk = tk // KH
kd = tk % KD
ci = tk // KD
"""

SUBPIXEL_TAPS = """\
kw = kw0 + SW * (offs_k % TW)
tk = offs_k // TW
kh = kh0 + SH * (tk % TH)
tk = tk // TH
kd = kd0 + SD * (tk % TD)
ci = tk // TD
# o + p - k is a multiple of s by the choice of k (exact division, negative or not)
idd = (od[:, None] + PD - kd[None, :]) // SD
ih = (oh[:, None] + PH - kh[None, :]) // SH
iw = (ow[:, None] + PW - kw[None, :]) // SW
ok = (idd >= 0) & (idd < ID) & (ih >= 0) & (ih < IH) & (iw >= 0) & (iw < IW)
w_off = (g * CIN_G + ci)[:, None] * sw0 + offs_n[None, :] * sw1
"""

STORE_OUTPUT = """\
sp = (od * OH + oh) * OW + ow
out_off = (nb * COUT * S + sp)[:, None] + co[None, :] * S
tl.store(out_ptr + out_off, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
"""

# a reduction over the spatial dims: this block's partial per channel (PART) -> ws[sample, block, channel]; the
# finishing kernel (FINISH) combines the blocks of a sample in a fixed order (deterministic, no atomics)
STORE_POOLED = """\
part = {{PART}}
ws_off = ((pid_m // TPS) * TPS + sp_t).to(tl.int64) * COUT + co
tl.store(ws_ptr + ws_off, part, mask=mask_n)
"""

# a reduction over the channels: every channel is in this tile (BLOCK_N >= COUT), ROW reduces it in registers
STORE_CHANNEL_REDUCED = """\
row = {{ROW}}
tl.store(out_ptr + nb * S + (od * OH + oh) * OW + ow, row.to(out_ptr.dtype.element_ty), mask=mask_m)
"""

# the second kernel of a spatially reduced conv: ws [N, TPS, C] -> out [N, C]
FINISH = """\
@triton.jit
def {{NAME}}_finish(ws_ptr, out_ptr, COUT, TPS, S, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    nb = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask_c = c < COUT
    r = tl.full((BLOCK_T, BLOCK_C), {{INIT}}, tl.float32)
    for t0 in range(0, TPS, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        v = tl.load(ws_ptr + (nb * TPS + t)[:, None] * COUT + c[None, :], mask=(t < TPS)[:, None] & mask_c[None, :], other={{OTHER}})
        {{COMBINE}}
    r = {{FOLD}}
    {{SCALE}}
    tl.store(out_ptr + nb * COUT + c, r.to(out_ptr.dtype.element_ty), mask=mask_c)
"""

# a transposed conv's input index along one dim (helper named NAME): output o and tap k read input (o + p - k*d) / s,
# where that is a whole number in range; any shapes (a tap-major vector, a flat [pixels, taps] tile)
TAP_INPUT = """\
@triton.jit
def {{NAME}}(o, k, P, D, S, N):
    t = o + P - k * D
    ok = t >= 0
    t = tl.where(ok, t, 0)  # the division of a negative number rounds differently in the interpreter
    ok = ok & (t % S == 0)
    i = t // S
    return i, ok & (i < N)

"""

# fp32 -> TF32 as cuDNN rounds (helper named NAME; the trailing blank line separates it from the next function)
TF32_RNA = """\
@triton.jit
def {{NAME}}(x, ASM: tl.constexpr):
    # fp32 -> TF32 (10 mantissa bits), round to nearest, ties away from zero (cvt.rna.tf32.f32). On the GPU
    # (ASM) the instruction itself, one per element: the bit arithmetic below costs four integer ops, and an
    # operand tile is rounded at every K step. The interpreter runs no PTX: there, add half an ulp of TF32
    # to the magnitude bits, then clear the 13 low bits; NaN kept as it is
    if ASM:
        r = tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1)
    else:
        u = x.to(tl.int32, bitcast=True)
        r = ((u + 0x1000) & -8192).to(tl.float32, bitcast=True)
        r = tl.where(x != x, x, r)
    return r

"""
