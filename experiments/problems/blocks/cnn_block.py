"""A ResNet basic block, fp32: conv3x3-BN-ReLU-conv3x3-BN, + identity, ReLU (BatchNorm in eval mode).

Eager H200 estimate: ~0.9 ms = 2 x 59 GFLOP convs in TF32 (0.35-0.6) + BN, ReLU, add passes, ~1 GB (0.25).
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
size = 56

SMALL = {"batch": 2, "channels": 5, "size": 17}


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
    def __init__(self, channels):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = _trained_bn(channels)
        self.conv2 = torch.nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = _trained_bn(channels)
        self.relu = torch.nn.ReLU(inplace=True)

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + x)


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels]
