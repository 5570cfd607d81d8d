"""Norm + residual (post-norm): LayerNorm(x + residual).

Eager H200 estimate: add (12 B/elem) + LayerNorm (8 B/elem) over 201M elements = 4 GB at ~4.2 TB/s ~ 0.96 ms.
"""

import torch

batch = 24
seq = 2048
hidden = 4096

SMALL = {"batch": 2, "seq": 33, "hidden": 127}


class Model(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        # Not the identity affine, so a kernel that skips it must fail the check.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x, residual):
        return self.norm(x + residual)


def get_inputs():
    return [torch.randn(batch, seq, hidden), torch.randn(batch, seq, hidden)]


def get_init_inputs():
    return [hidden]
