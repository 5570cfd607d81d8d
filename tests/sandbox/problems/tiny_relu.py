"""Test problem: y = relu(x * 2) + 1 (tiny, so the adversarial suite stays fast on 2 CPU cores)."""

import torch

rows = 64
cols = 257
SMALL = {"rows": 8, "cols": 127}


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
