"""Convolution + pointwise + norm: Conv2d 64 -> 128 (3x3) -> GELU -> GroupNorm(8 groups).

Eager H200 estimate: ~1.2 ms = 155 GFLOP conv in TF32 (0.45-0.7) + GELU and GroupNorm, ~5 passes over 537 MB (0.65).
"""

import torch

# cuDNN runs fp32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32), so eager itself is
# ~1e-3 off the exact result; 5e-3 admits a TF32 kernel as eager uses, while a bf16 one (~8x the error) fails.
ATOL = 5e-3
RTOL = 5e-3

batch = 64
in_channels = 64
out_channels = 128
groups = 8
size = 128

SMALL = {"batch": 2, "in_channels": 3, "out_channels": 12, "groups": 3, "size": 17}


class Model(torch.nn.Module):
    def __init__(self, in_channels, out_channels, groups):
        super().__init__()
        self.conv = torch.nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1)
        self.norm = torch.nn.GroupNorm(groups, out_channels)
        # Not the identity affine, so a kernel that skips it must fail the check.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.conv(x)))


def get_inputs():
    return [torch.randn(batch, in_channels, size, size)]


def get_init_inputs():
    return [in_channels, out_channels, groups]
