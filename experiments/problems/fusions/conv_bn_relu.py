"""Convolution followed by pointwise ops: Conv2d (no bias) -> BatchNorm2d (eval: a per-channel affine) -> ReLU.

Eager H200 estimate: ~1.2 ms = 2*64*128*112*112*128*9 = 237 GFLOP in TF32 (0.7-1) + BN, ReLU over 411 MB maps (0.4).
"""

import torch

# inference: BatchNorm normalizes with its (trained-looking) running statistics, not the batch's
MODE = "eval"

# cuDNN runs fp32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32), so eager itself is
# ~1e-3 off the exact result; 5e-3 admits a TF32 kernel as eager uses, while a bf16 one (~8x the error) fails.
ATOL = 5e-3
RTOL = 5e-3

batch = 64
channels = 128
size = 112

SMALL = {"batch": 2, "channels": 5, "size": 17}


class Model(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, kernel_size=3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(channels)
        self.relu = torch.nn.ReLU()
        # Trained-looking statistics and affine: the defaults make BN the identity, which a kernel could skip.
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.2, 0.2)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels]
