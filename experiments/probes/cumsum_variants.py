"""Which form of the builtin's blocked scan compiles on the GPU (Triton 3.6 failed `PassManager::run` on
the seed's `tl.cumsum(v, axis=1) + carry[:, None]`: a scan result combined with a broadcast, cf.
triton-lang/triton#7817). Prints, per variant and shape, compiled or the error, max error, and time."""
import torch
import triton
import triton.language as tl


@triton.jit
def k_add_after(x_ptr, y_ptr, NROWS, R, BLOCK_ROWS: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    rmask = rows < NROWS
    carry = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    for start in range(0, R, BLOCK_R):
        cols = start + tl.arange(0, BLOCK_R)
        mask = rmask[:, None] & (cols < R)[None, :]
        offs = rows[:, None] * R + cols[None, :]
        v = tl.load(x_ptr + offs, mask=mask, other=0.0)
        y = tl.cumsum(v, axis=1) + carry[:, None]
        tl.store(y_ptr + offs, y, mask=mask)
        carry += tl.sum(v, axis=1)


@triton.jit
def k_carry_in(x_ptr, y_ptr, NROWS, R, BLOCK_ROWS: tl.constexpr, BLOCK_R: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    rmask = rows < NROWS
    carry = tl.zeros([BLOCK_ROWS], dtype=tl.float32)
    first = (tl.arange(0, BLOCK_R) == 0)[None, :]
    for start in range(0, R, BLOCK_R):
        cols = start + tl.arange(0, BLOCK_R)
        mask = rmask[:, None] & (cols < R)[None, :]
        offs = rows[:, None] * R + cols[None, :]
        v = tl.load(x_ptr + offs, mask=mask, other=0.0)
        v = tl.where(first, v + carry[:, None], v)
        tl.store(y_ptr + offs, tl.cumsum(v, axis=1), mask=mask)
        carry = tl.sum(v, axis=1)


@triton.jit
def k_row(x_ptr, y_ptr, NROWS, R, BLOCK_ROWS: tl.constexpr, BLOCK_R: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    carry = 0.0
    for start in range(0, R, BLOCK_R):
        cols = start + tl.arange(0, BLOCK_R)
        mask = cols < R
        v = tl.load(x_ptr + row * R + cols, mask=mask, other=0.0)
        y = tl.cumsum(v, axis=0) + carry
        tl.store(y_ptr + row * R + cols, y, mask=mask)
        carry += tl.sum(v, axis=0)


def run(kern, x, block_rows, block_r, warps):
    n, r = x.shape
    y = torch.empty_like(x)
    grid = (n,) if kern is k_row else (triton.cdiv(n, block_rows),)
    kern[grid](x, y, n, r, BLOCK_ROWS=block_rows, BLOCK_R=block_r, num_warps=warps)
    return y


def ms(f):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    f(); torch.cuda.synchronize(); s.record()
    for _ in range(10):
        f()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / 10


for shape in [(49152, 8192), (33, 127), (1000, 4097), (8, 100000)]:
    x = torch.randn(shape, device="cuda")
    ref = torch.cumsum(x.double(), dim=1).float()
    t_ref = ms(lambda: torch.cumsum(x, dim=1))
    for kern in (k_add_after, k_carry_in, k_row):
        for block_rows, block_r, warps in [(1, 4096, 8), (4, 1024, 8), (2, 2048, 8), (1, 1024, 4)]:
            br = min(block_r, triton.next_power_of_2(shape[1]))
            try:
                y = run(kern, x, block_rows, br, warps)
                err = float((y - ref).abs().max())
                t = ms(lambda: run(kern, x, block_rows, br, warps))
                print(f"{shape} {kern.__name__} rows={block_rows} r={br} w={warps}: ok err={err:.2e} {t:.3f} ms"
                      f" (torch {t_ref:.3f} ms)")
            except Exception as exc:
                print(f"{shape} {kern.__name__} rows={block_rows} r={br} w={warps}: FAIL {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:100]}")
