# expect: correct
# A correct Triton candidate: its own kernel does all the work.
import torch
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    tl.store(y_ptr + offs, tl.maximum(x * 2.0, 0.0) + 1.0, mask=m)


def relu2(x):
    y = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 256),)](x, y, n, BLOCK=256)
    return y


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return relu2(x.contiguous())
