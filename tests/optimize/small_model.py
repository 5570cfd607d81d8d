"""A small model for the whole-model tests: a conv block, then two identical MLP blocks (KernelBench format)."""
import torch
from torch import nn


class CNNBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class MLPBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, dim)
        self.act = nn.GELU()

    def forward(self, x):
        return x + self.act(self.fc(self.norm(x)))


class Model(nn.Module):
    def __init__(self, channels, dim):
        super().__init__()
        self.cnn = CNNBlock(channels)
        self.blocks = nn.ModuleList([MLPBlock(dim), MLPBlock(dim)])

    def forward(self, x):
        y = self.cnn(x).flatten(1)
        for block in self.blocks:
            y = block(y)
        return y


batch_size = 2
channels = 4
side = 2
dim = channels * side * side
SMALL = {"batch_size": 2, "channels": 4, "side": 2}  # already small: the CPU runs these very sizes


def get_init_inputs():
    return [channels, dim]


def get_inputs():
    return [torch.randn(batch_size, channels, side, side)]
