"""Residual add then RMSNorm in bf16, written as in Llama-style model code (upcast to fp32 inside the norm);
returns the normalised tensor and the new residual stream.

Eager H200 estimate: 7 kernels ~ 42 B/elem * 134M = 5.6 GB at ~4.2 TB/s ~ 1.35 ms (fused: 8 B/elem, ~0.26 ms).
"""

import torch

DTYPE = "bfloat16"

batch = 4
seq = 4096
hidden = 8192
eps = 1e-6

SMALL = {"batch": 1, "seq": 33, "hidden": 127}


class Model(torch.nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        # Trained-looking scale rather than ones, so skipping the weight cannot pass the check.
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.eps = eps

    def forward(self, x, residual):
        h = x + residual
        hf = h.float()
        variance = hf.pow(2).mean(-1, keepdim=True)
        normed = hf * torch.rsqrt(variance + self.eps)
        return self.weight * normed.to(h.dtype), h


def get_inputs():
    return [torch.randn(batch, seq, hidden), torch.randn(batch, seq, hidden)]


def get_init_inputs():
    return [hidden, eps]
