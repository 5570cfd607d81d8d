"""Linear + ReLU: torch's GEMM, then a Triton ReLU over the flat output (defines its own Model)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

CONFIG = {"BLOCK": 1024}
SPACE = {"BLOCK": [64, 128, 256, 512, 1024]}


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = torch.empty_like(x)
    n = x.numel()
    block = CONFIG["BLOCK"]  # read at call time: the sandbox and the export set CONFIG after import
    relu_kernel[(triton.cdiv(n, block),)](x, y, n, BLOCK=block)
    return y


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


class ModelNew(Model):
    def forward(self, x):
        return relu(torch.nn.functional.linear(x, self.linear.weight, self.linear.bias))
