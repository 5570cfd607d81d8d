"""Softmax over long rows (16384 columns: a row is 64 KB in fp32).

Eager H200 estimate: read + write 24576*16384*4 B = 3.2 GB at ~4.2 TB/s ~ 0.77 ms.
"""

import torch

rows = 24576
cols = 16384

SMALL = {"rows": 33, "cols": 127}


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
