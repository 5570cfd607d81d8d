"""A transformer MLP: Linear(1024 -> 4096) -> GELU -> Linear(4096 -> 1024).

Eager H200 estimate: 2 * 2*8192*1024*4096 = 137 GFLOP at fp32 51 TFLOP/s ~ 2.7 ms, + GELU over 134 MB ~ 0.06 ms.
"""

import torch

tokens = 8192
dim = 1024
hidden = 4096

SMALL = {"tokens": 33, "dim": 64, "hidden": 127}


class Model(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(dim, hidden),
            torch.nn.GELU(),
            torch.nn.Linear(hidden, dim),
        )

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(tokens, dim)]


def get_init_inputs():
    return [dim, hidden]
