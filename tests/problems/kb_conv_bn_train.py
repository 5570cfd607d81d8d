import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Convolution, BatchNorm and ReLU, in KernelBench's default (training) mode: BatchNorm normalizes with the
    batch's statistics and updates its running statistics on every call.
    """
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size)
        self.bn = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))

batch_size = 64
in_channels = 8
out_channels = 32
height, width = 64, 64
kernel_size = 3

SMALL = {"batch_size": 2, "in_channels": 3, "out_channels": 4, "height": 8, "width": 8}

def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
