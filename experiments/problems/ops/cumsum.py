"""Inclusive prefix sum (scan) along rows of 8192.

Eager H200 estimate: read + write 49152*8192*4 B = 3.2 GB at ~4.2 TB/s ~ 0.77 ms (eager scans run below peak).
"""

import torch

# fp32 reordering error of a blocked scan over 8192 N(0,1) values measured ~4e-5 (< default 1e-4).
rows = 49152
cols = 8192

SMALL = {"rows": 33, "cols": 127}


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
