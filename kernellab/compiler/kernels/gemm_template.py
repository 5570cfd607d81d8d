# ruff: noqa: E501 - the templates are the generated Triton lines, verbatim
"""The GEMM kernel as Triton template text (``template.render`` fills the ``{{HOLES}}``; ``gemm.py`` says what goes
in each). One work item is a (batch, K split, output tile) triple; a program takes one (``ONE_PROGRAM``) or, when
persistent, walks them (``PERSISTENT``). The K loop is fixed text; what follows it (``FINISH``) is the plain store
with its split-K fixup (``FINISH_TILE``) or the row reduction over N with its ticket fixup (``FINISH_ROWS``)."""

from __future__ import annotations

__all__ = ["KERNEL", "ONE_PROGRAM", "PERSISTENT", "WORK_ITEM", "FINISH_TILE", "FINISH_ROWS", "WRITE_VECTOR",
           "NORMALIZE_ROWS", "STORE_TILE", "STORE_VECTOR"]

# the output tile of this work item, and the per-row vector of a reduction that leaves one value per row
STORE_TILE = "tl.store(out_ptr + pid_b64 * stride_ob + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])"
STORE_VECTOR = "tl.store(out_ptr + pid_b64 * stride_ob + offs_m * stride_om, vec.to(out_ptr.dtype.element_ty), mask=mask_m)"

# HELPERS: the @triton.jit epilogue functions; PARAMS: pointers, sizes, strides, then the constexprs
KERNEL = """\
{{HELPERS}}
@triton.jit
def {{KERNEL}}(
    {{PARAMS}}
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    tiles = num_pid_m * num_pid_n
    {{PROGRAM}}
"""

ONE_PROGRAM = """\
w = tl.program_id(0)
{{WORK_ITEM}}
"""

PERSISTENT = """\
# persistent: about one program per SM walks the work items
for w in range(tl.program_id(0), B * tiles * SPLIT_K, tl.num_programs(0)):
    {{WORK_ITEM}}
"""

# DOT: the tl.dot of the dtype and precision; FINISH: FINISH_TILE or FINISH_ROWS
WORK_ITEM = """\
pid_b = w // (tiles * SPLIT_K)
rem = w - pid_b * (tiles * SPLIT_K)
pid_k = rem // tiles
t = rem - pid_k * tiles
# grouped ordering: GROUP_M row blocks sweep the columns together, so B tiles are reused from L2
group_span = GROUP_M * num_pid_n
first_m = (t // group_span) * GROUP_M
group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
pid_m = first_m + (t % group_span) % group_rows
pid_n = (t % group_span) // group_rows
pid_b64 = pid_b.to(tl.int64)
offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
mask_m = offs_m < M
mask_n = offs_n < N
# clamped indices keep the K loop free of M/N masks; the hints let loads vectorise
offs_am = tl.max_contiguous(tl.multiple_of(tl.where(mask_m, offs_m, 0), BLOCK_M), BLOCK_M)
offs_bn = tl.max_contiguous(tl.multiple_of(tl.where(mask_n, offs_n, 0), BLOCK_N), BLOCK_N)
offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
a_ptrs = a_ptr + pid_b64 * stride_ab + offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak
b_ptrs = b_ptr + pid_b64 * stride_bb + offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn
acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
for kt in range(pid_k, tl.cdiv(K, BLOCK_K), SPLIT_K):
    if EVEN_K:
        a = tl.load(a_ptrs)
        b = tl.load(b_ptrs)
    else:
        k_left = K - kt * BLOCK_K
        a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)
    {{DOT}}
    a_ptrs += (BLOCK_K * SPLIT_K) * stride_ak
    b_ptrs += (BLOCK_K * SPLIT_K) * stride_bk
{{FINISH}}
"""

# No row reduction. LOAD_OPERANDS: the epilogue's operands for this tile, as fp32 [BLOCK_M, BLOCK_N];
# EPILOGUE: the call of the epilogue helper. Split-K: partials to the workspace, the last split of a tile
# sums them in a fixed order (deterministic) and applies the epilogue once.
FINISH_TILE = """\
if SPLIT_K == 1:
    {{LOAD_OPERANDS}}
    {{EPILOGUE}}
    tl.store(out_ptr + pid_b64 * stride_ob + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
else:
    tile_id = pid_b * tiles + t
    tile_offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    ws_tile = ws_ptr + tile_id.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(ws_tile + pid_k * (BLOCK_M * BLOCK_N) + tile_offs, acc)
    # every thread's partial is written before the ticket (release); the last one reads through L2
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt_ptr + tile_id, 1, sem="acq_rel")
    if ticket == SPLIT_K - 1:
        tl.atomic_xchg(cnt_ptr + tile_id, 0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(ws_tile + s * (BLOCK_M * BLOCK_N) + tile_offs, cache_modifier=".cg")
        {{LOAD_OPERANDS}}
        {{EPILOGUE}}
        tl.store(out_ptr + pid_b64 * stride_ob + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on, acc.to(out_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])
"""

# A row reduction over N. ONE_TILE: the whole row is in this tile, reduced in registers and stored. Else each tile
# stores its per-row statistics st0 (and st1: TWO_STATS lines) to the workspace (and STORE_RAW: its raw values)
# and takes a ticket; the tile that arrives last folds the statistics (COMBINE), FINALIZEs them and WRITE_ROWS.
# No tile waits on another; the counters reset themselves. INIT0: the statistic's value on masked rows.
FINISH_ROWS = """\
{{LOAD_OPERANDS}}
{{EPILOGUE}}
if ONE_N_TILE:
    {{ONE_TILE}}
else:
    {{TILE_STATS}}
    {{STORE_RAW}}
    row_ws = ws_ptr + (pid_b64 * M + offs_m) * num_pid_n
    ws_plane = B * M * num_pid_n
    tl.store(row_ws + pid_n, st0, mask=mask_m)
    {{STORE_ST1}}
    # every thread's stores land before the ticket (release); the last tile reads through L2
    tl.debug_barrier()
    blk = pid_b * num_pid_m + pid_m
    ticket = tl.atomic_add(cnt_ptr + blk, 1, sem="acq_rel")
    if ticket == num_pid_n - 1:
        tl.atomic_xchg(cnt_ptr + blk, 0)
        r0 = tl.load(row_ws, mask=mask_m, other={{INIT0}}, cache_modifier=".cg")
        {{LOAD_R1}}
        for j in range(1, num_pid_n):
            c0 = tl.load(row_ws + j, mask=mask_m, other={{INIT0}}, cache_modifier=".cg")
            {{LOAD_C1}}
            {{COMBINE}}
        {{FINALIZE}}
        {{WRITE_ROWS}}
"""

# the last tile's write of a reduction that leaves one value per row (VEC: lse or r0)
WRITE_VECTOR = """\
vec = {{VEC}}
{{ROW_EPILOGUE}}
tl.store(out_ptr + pid_b64 * stride_ob + offs_m * stride_om, vec.to(out_ptr.dtype.element_ty), mask=mask_m)
"""

# the last tile normalises the row block the other tiles stored a moment ago (still in L2); fresh names (y,
# offs_nj, ...) so the loop carries no [BLOCK_M, BLOCK_N] value from outside
NORMALIZE_ROWS = """\
for j in range(0, num_pid_n):
    offs_nj = j * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_nj = offs_nj < N
    o_mask = mask_m[:, None] & mask_nj[None, :]
    {{LOAD_OPERANDS}}
    y = tl.load(out_ptr + pid_b64 * stride_ob + offs_m[:, None] * stride_om + offs_nj[None, :] * stride_on, mask=o_mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    {{NORMALIZE}}
    {{ROW_EPILOGUE}}
    tl.store(out_ptr + pid_b64 * stride_ob + offs_m[:, None] * stride_om + offs_nj[None, :] * stride_on, y.to(out_ptr.dtype.element_ty), mask=o_mask)
"""
