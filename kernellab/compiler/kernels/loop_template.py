# ruff: noqa: E501 - the templates are the generated Triton lines, verbatim
"""The pointwise and row-reduction loop kernels as Triton template text (``template.render`` fills the
``{{HOLES}}``; ``loopgen.py`` says what goes in each and its module docstring how the indexing works). Every
kernel is ``KERNEL`` around one program: ``FLAT``, ``PERSISTENT`` or ``TILED`` for a pointwise group, ``ROWS``
for a rows group. ``{{K}}`` is an operand's number (its pointer ``t{{K}}``, strides ``s{{K}}_0..4``, offsets
``a{{K}}`` per row and ``f{{K}}`` per element, loaded value ``x{{K}}``)."""

from __future__ import annotations

__all__ = ["KERNEL", "FLAT", "PERSISTENT", "FLAT_OFFSET", "TILED", "TILED_OFFSET", "ROWS", "ROW_OFFSET",
           "COLUMNS", "FULL_OFFSET", "LOAD_FULL", "LOAD_ROW", "STORE_FULL", "STORE_ROW", "R_LOOP", "ACC_INIT",
           "ONLINE_INIT", "ONLINE_UPDATE", "ONLINE_DONE"]

# PARAMS: pointers, scalars, sizes, strides, then the constexprs; OPERANDS: which graph value each t{{K}} is
KERNEL = """\
@triton.jit
def {{NAME}}(
    {{PARAMS}}
):
    # operands: {{OPERANDS}}
    {{BODY}}
"""

# -- pointwise: OFFSETS (FLAT_OFFSET or TILED_OFFSET per operand), then BODY (the group's ops and stores)

FLAT = """\
pid = tl.program_id(0)
idx = pid * BLOCK_R + tl.arange(0, BLOCK_R)
if BIG:
    idx = idx.to(tl.int64)
mask = idx < NROWS
i2 = idx % S2
i1 = (idx // S2) % S1
i0 = idx // (S2 * S1)
{{OFFSETS}}
{{BODY}}
"""

# a grid-stride loop: a big domain pays for one program launch per SM instead of one per block
PERSISTENT = """\
pid = tl.program_id(0)
base = pid * BLOCK_R
step = tl.num_programs(0) * BLOCK_R
if BIG:
    base = base.to(tl.int64)
    step = step.to(tl.int64)
for start in range(base, NROWS, step):
    idx = start + tl.arange(0, BLOCK_R)
    mask = idx < NROWS
    i2 = idx % S2
    i1 = (idx // S2) % S1
    i0 = idx // (S2 * S1)
    {{OFFSETS}}
    {{BODY}}
"""

# a contiguous operand (FULL, chosen per call) indexes by the flat position: no integer division
FLAT_OFFSET = """\
if FULL{{K}}:
    f{{K}} = idx
else:
    f{{K}} = i0 * s{{K}}_0 + i1 * s{{K}}_1 + i2 * s{{K}}_2
"""

# a [BLOCK_ROWS, BLOCK_R] tile of (dim 1, dim 2): both sides of a transpose coalesce
TILED = """\
pid = tl.program_id(0)
nx = tl.cdiv(S2, BLOCK_R)
ny = tl.cdiv(S1, BLOCK_ROWS)
i0 = pid // (nx * ny)
i1 = ((pid // nx) % ny) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
i2 = (pid % nx) * BLOCK_R + tl.arange(0, BLOCK_R)
if BIG:
    i0 = i0.to(tl.int64)
    i1 = i1.to(tl.int64)
    i2 = i2.to(tl.int64)
mask = (i1 < S1)[:, None] & (i2 < S2)[None, :]
{{OFFSETS}}
{{BODY}}
"""

TILED_OFFSET = "f{{K}} = i0 * s{{K}}_0 + i1[:, None] * s{{K}}_1 + i2[None, :] * s{{K}}_2"

# -- rows: a program takes BLOCK_ROWS rows (o0, o1, o2); ROW_OFFSETS (ROW_OFFSET per operand), then BODY

ROWS = """\
pid = tl.program_id(0)
if INNER:
    # the reduced dims are strided and the innermost kept dim is contiguous (a sum over
    # the middle dim): a program takes BLOCK_ROWS neighbours along that dim, so every
    # load of the [BLOCK_ROWS, BLOCK_R] tile is coalesced along axis 0
    nblk = tl.cdiv(S2, BLOCK_ROWS)
    outer = pid // nblk
    o2 = (pid % nblk) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    if BIG:
        outer = outer.to(tl.int64)
        o2 = o2.to(tl.int64)
    o1 = outer % S1
    o0 = outer // S1
    rows = outer * S2 + o2
    rmask = o2 < S2
else:
    rows = pid * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    if BIG:
        rows = rows.to(tl.int64)
    rmask = rows < NROWS
    o2 = rows % S2
    o1 = (rows // S2) % S1
    o0 = rows // (S2 * S1)
{{ROW_OFFSETS}}
{{BODY}}
"""

ROW_OFFSET = """\
if FULL{{K}}:
    a{{K}} = rows
else:
    a{{K}} = o0 * s{{K}}_0 + o1 * s{{K}}_1 + o2 * s{{K}}_2
"""

# the columns (q0, q1) of one chunk of the row; START: "" (one pass) or "start + " (in an R_LOOP)
COLUMNS = """\
r = {{START}}tl.arange(0, BLOCK_R)
cmask = r < R
q1 = r % R1
q0 = r // R1
mask = rmask[:, None] & cmask[None, :]
"""

FULL_OFFSET = """\
if FULL{{K}}:
    f{{K}} = a{{K}}[:, None] * R + r[None, :]
else:
    f{{K}} = a{{K}}[:, None] + (q0 * s{{K}}_3 + q1 * s{{K}}_4)[None, :]
"""

# OTHER/CAST: a bool operand loads as 0/1 and stays bool, every other one computes in fp32
LOAD_FULL = "x{{K}} = tl.load(t{{K}} + f{{K}}, mask=mask, other={{OTHER}}){{CAST}}"
LOAD_ROW = "x{{K}} = tl.load(t{{K}} + a{{K}}[:, None], mask=rmask[:, None], other={{OTHER}}){{CAST}}"
# VALUE: the value cast to the operand's storage type
STORE_FULL = "tl.store(t{{K}} + f{{K}}, {{VALUE}}, mask=mask)"
STORE_ROW = "tl.store(t{{K}} + a{{K}}[:, None], {{VALUE}}, mask=rmask[:, None])"

# one pass over the row in BLOCK_R chunks (a multi_pass reduction level, or the stores of full outputs)
R_LOOP = """\
for start in range(0, R, BLOCK_R):
    {{BODY}}
"""

# a reduction's per-column accumulator, folded over axis 1 after its loop; INIT: the op's identity
ACC_INIT = "acc_{{N}} = tl.full([BLOCK_ROWS, BLOCK_R], {{INIT}}, tl.float32)"

# online softmax: SUM = sum(exp(X - MAX)) and MAX = amax(X) in one read of X (per row, [BLOCK_ROWS, 1])
ONLINE_INIT = """\
acc_{{MAX}} = tl.full([BLOCK_ROWS, 1], float("-inf"), tl.float32)
acc_{{SUM}} = tl.zeros([BLOCK_ROWS, 1], tl.float32)
"""

# the running sum is rescaled whenever the running max grows; X: the chunk of X
ONLINE_UPDATE = """\
cm_{{MAX}} = tl.max(tl.where(mask, {{X}}, float("-inf")), axis=1)[:, None]
mn_{{MAX}} = tl.maximum(acc_{{MAX}}, cm_{{MAX}})
sh_{{MAX}} = tl.where(mn_{{MAX}} == float("-inf"), 0.0, mn_{{MAX}})  # rows that are all -inf so far
acc_{{SUM}} = acc_{{SUM}} * tl.exp(acc_{{MAX}} - sh_{{MAX}}) + tl.sum(tl.where(mask, tl.exp({{X}} - sh_{{MAX}}), 0.0), axis=1)[:, None]
acc_{{MAX}} = mn_{{MAX}}
"""

ONLINE_DONE = """\
v_{{MAX}} = acc_{{MAX}}
v_{{SUM}} = acc_{{SUM}}
"""
