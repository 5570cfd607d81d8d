"""RMSNorm written out as in Llama-style model code: x * rsqrt(mean(x^2) + eps) * weight.

Eager H200 estimate: 5 kernels (pow, mean, add+rsqrt, mul, mul) ~ 28 B/elem * 134M = 3.8 GB at ~4.2 TB/s ~ 0.9 ms.
"""

import torch

batch = 16
seq = 2048
hidden = 4096
eps = 1e-6

SMALL = {"batch": 2, "seq": 33, "hidden": 127}


class Model(torch.nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        # Trained-looking scale rather than ones, so skipping the weight cannot pass the check.
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


def get_inputs():
    return [torch.randn(batch, seq, hidden)]


def get_init_inputs():
    return [hidden, eps]
