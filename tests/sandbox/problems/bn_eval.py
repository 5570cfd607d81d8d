"""Test problem: BatchNorm2d -> ReLU declared MODE = "eval" (running statistics).

Same model as bn_train.py. The inputs are shifted and scaled per channel, so a
candidate that drops the BatchNorm, or normalizes with the batch statistics, is far off."""

import torch

MODE = "eval"

batch = 4
channels = 6
height = 5
width = 7
SMALL = {"batch": 3, "channels": 4, "height": 5, "width": 3}


class Model(torch.nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(channels)
        with torch.no_grad():
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)
            self.bn.running_mean.uniform_(-1.0, 1.0)
            self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):
        return torch.relu(self.bn(x))


def get_inputs():
    shift = torch.linspace(-2.0, 2.0, channels).view(1, -1, 1, 1)
    return [torch.randn(batch, channels, height, width) * 3.0 + shift]


def get_init_inputs():
    return [channels]
