"""Test problem: dropout (p=0.5) in training mode, then a scale: the forward draws random numbers,
which the sandbox makes reproducible by reseeding right before each reference and candidate call."""

import torch

rows = 16
cols = 33
SMALL = {"rows": 8, "cols": 17}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) * 3.0


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
