"""fp32 GEMM with a long reduction: (1024 x 65536) @ (65536 x 1024), where split-K pays off.

Eager H200 estimate: 2*1024*1024*65536 = 137 GFLOP at fp32 51 TFLOP/s ~ 2.7 ms.
"""

import torch

m = 1024
k = 65536
n = 1024

SMALL = {"m": 17, "k": 1023, "n": 33}


class Model(torch.nn.Module):
    def forward(self, a, b):
        return a @ b


def get_inputs():
    # B scaled by 1/sqrt(K): C is O(1), so fp32 reordering error (~eps*sqrt(K)) stays far below 1e-4.
    return [torch.randn(m, k), torch.randn(k, n) / k**0.5]


def get_init_inputs():
    return []
