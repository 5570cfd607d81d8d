"""Test problem for GPU integrity checks that need measurable device time: y = relu(x * 2) + 1."""

import torch

rows = 8192
cols = 8192
SMALL = {"rows": 8, "cols": 127}


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
