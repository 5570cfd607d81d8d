"""3x3 convolution, 256 -> 256 channels at 56x56 (a ResNet stage-3 shape), stride 1, padding 1.

Eager H200 estimate: ~0.7 ms = 2*64*256*56*56*256*9 = 237 GFLOP in cuDNN TF32 at 355 TFLOP/s (4.6 ms if TF32 is off).
"""

import torch

# cuDNN runs fp32 convolutions in TF32 by default (torch.backends.cudnn.allow_tf32), so eager itself is
# ~1e-3 off the exact result; 5e-3 admits a TF32 kernel as eager uses, while a bf16 one (~8x the error) fails.
ATOL = 5e-3
RTOL = 5e-3

batch = 64
channels = 256
size = 56

SMALL = {"batch": 2, "channels": 5, "size": 17}


class Model(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x):
        return self.conv(x)


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return [channels]
