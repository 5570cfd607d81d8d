# expect: compile_error triton_compile
# gpu
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.store(y_ptr + offs, tl.no_such_function(x), mask=offs < n)


class ModelNew(Model):
    def forward(self, x):
        y = torch.empty_like(x)
        k[(1,)](x, y, x.numel(), BLOCK=1024)
        return y
