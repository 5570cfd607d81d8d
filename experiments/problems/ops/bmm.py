"""Batched fp32 GEMM: torch.bmm over 96 independent (1024 x 512) @ (512 x 1024) products.

Eager H200 estimate: 2*96*1024*512*1024 = 103 GFLOP at fp32 51 TFLOP/s ~ 2.0 ms.
"""

import torch

batch = 96
m = 1024
k = 512
n = 1024

SMALL = {"batch": 3, "m": 33, "k": 16, "n": 127}


class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


def get_inputs():
    return [torch.randn(batch, m, k), torch.randn(batch, k, n) / k**0.5]


def get_init_inputs():
    return []
