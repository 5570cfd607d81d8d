# expect: runtime_error out_of_resources
# gpu
# Asks for more shared memory than an SM has (a 256x256 fp32 dot: its operands alone need 512 KB;
# 512x512 took over 3 minutes to compile).
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, BLOCK: tl.constexpr):
    r = tl.arange(0, BLOCK)
    a = tl.load(x_ptr + r[:, None] * BLOCK + r[None, :])
    b = tl.dot(a, a)
    tl.store(y_ptr + r[:, None] * BLOCK + r[None, :], b)


class ModelNew(Model):
    def forward(self, x):
        big = torch.zeros(256 * 256, device=x.device)
        out = torch.empty_like(big)
        k[(1,)](big, out, BLOCK=256, num_warps=8)
        return torch.relu(x * 2.0) + 1.0
