"""GroupNorm with one channel per group at every size: each output is (x - x) / sqrt(eps), rounding
noise around zero. A null output (zeros) passes every trial, so the sandbox cannot judge a candidate:
KernelBench level2/30 at the instance kernellab derived for it before issue 34."""
import torch

batch_size = 4
channels = 8


class Model(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.norm = torch.nn.GroupNorm(channels, channels)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.rand(batch_size, channels)]


def get_init_inputs():
    return [channels]
