"""Sum over the sequence dimension of a (batch, seq, hidden) tensor: a strided (non-innermost) reduction.

Eager H200 estimate: read 96*2048*4096*4 B = 3.2 GB at ~4.2 TB/s ~ 0.77 ms.
"""

import torch

batch = 96
seq = 2048
hidden = 4096

SMALL = {"batch": 3, "seq": 33, "hidden": 127}


class Model(torch.nn.Module):
    def forward(self, x):
        return x.sum(dim=1)


def get_inputs():
    return [torch.randn(batch, seq, hidden)]


def get_init_inputs():
    return []
