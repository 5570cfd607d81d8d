# expect: crash cuda_fault
# gpu
# A Triton kernel that stores far outside its buffer: an illegal memory access.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import triton
import triton.language as tl


@triton.jit
def bad_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs + (1 << 40), tl.zeros((BLOCK,), dtype=tl.float32))


class ModelNew(Model):
    def forward(self, x):
        y = torch.empty_like(x)
        bad_kernel[(4,)](y, y.numel(), BLOCK=1024)
        torch.cuda.synchronize()
        return y
