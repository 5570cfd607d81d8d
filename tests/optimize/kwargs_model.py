"""A model whose blocks are called as library models call theirs: a mask by keyword, constants (None,
a float) beside it, and a ``(hidden, None)`` tuple back (KernelBench format)."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, mask=None, cache=None, scale=1.0):
        y = self.norm(self.fc(x)) * scale
        if mask is not None:
            y = y.masked_fill(mask, 0.0)
        return y, cache


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.blocks = nn.ModuleList([Block(dim), Block(dim)])

    def forward(self, x, mask):
        for block in self.blocks:
            x = block(x, mask=mask, cache=None, scale=0.5)[0]
        return x


batch_size = 4
dim = 16


def get_init_inputs():
    return [dim]


def get_inputs():
    mask = torch.zeros(batch_size, dim, dtype=torch.bool)
    mask[:, -3:] = True
    return [torch.randn(batch_size, dim), mask]
