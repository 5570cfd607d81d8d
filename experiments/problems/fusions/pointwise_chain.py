"""A chain of 7 pointwise ops: per-feature affine, SiLU, residual add, clamp, scale, tanh.

Eager H200 estimate: 7 kernels ~ 60 B/elem * 134M = 8 GB at ~4.2 TB/s ~ 1.9 ms (fused: 1.07 GB, ~0.26 ms).
"""

import torch

rows = 16384
cols = 8192

SMALL = {"rows": 33, "cols": 127}


class Model(torch.nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.scale = torch.nn.Parameter(1.0 + 0.1 * torch.randn(cols))
        self.shift = torch.nn.Parameter(0.1 * torch.randn(cols))

    def forward(self, x):
        y = x * self.scale
        y = y + self.shift
        y = torch.nn.functional.silu(y)
        y = y + x
        y = torch.clamp(y, -3.0, 3.0)
        y = y * 0.5
        return torch.tanh(y)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return [cols]
