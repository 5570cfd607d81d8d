"""A MobileNet depthwise-separable block, fp32: depthwise 3x3 conv-BN-ReLU6, then pointwise 1x1 conv-BN-ReLU6.

Eager H200 estimate: ~1.3 ms = memory-bound: dw conv, 1x1 conv, 4 BN/ReLU6 passes move ~5 GB (1.2) + 26 GFLOP TF32 (0.1).
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
out_channels = 128
size = 112

SMALL = {"batch": 2, "channels": 5, "out_channels": 7, "size": 17}


def _trained_bn(channels):
    bn = torch.nn.BatchNorm2d(channels)
    # Trained-looking statistics: the defaults make BN the identity, which a kernel could skip.
    with torch.no_grad():
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    return bn


class Model(torch.nn.Module):
    def __init__(self, channels, out_channels):
        super().__init__()
        self.block = torch.nn.Sequential(
            torch.nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False),
            _trained_bn(channels),
            torch.nn.ReLU6(),
            torch.nn.Conv2d(channels, out_channels, 1, bias=False),
            _trained_bn(out_channels),
            torch.nn.ReLU6(),
        )

    def forward(self, x):
        return self.block(x)


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels, out_channels]
