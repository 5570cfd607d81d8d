"""Linear + ReLU with a Triton ReLU; ModelNew subclasses the problem's Model, which it does not define."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CONFIG = {"BLOCK": 1024}


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


class ModelNew(Model):  # noqa: F821 -- Model comes from the problem's source
    def forward(self, x):
        y = torch.nn.functional.linear(x, self.linear.weight, self.linear.bias).contiguous()
        out = torch.empty_like(y)
        n = y.numel()
        relu_kernel[(triton.cdiv(n, CONFIG["BLOCK"]),)](y, out, n, BLOCK=CONFIG["BLOCK"])
        return out
