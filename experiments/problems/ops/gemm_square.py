"""Square fp32 GEMM: C = A @ B with M = N = K = 4096.

Eager H200 estimate: 2*4096^3 = 137 GFLOP at fp32 51 TFLOP/s (no TF32 for matmul by default) ~ 2.7 ms.
"""

import torch

m = 4096
k = 4096
n = 4096

SMALL = {"m": 33, "k": 64, "n": 127}


class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    # B scaled by 1/sqrt(K) so that C is O(1) and the default 1e-4 tolerance stays meaningful.
    return [torch.randn(m, k), torch.randn(k, n) / k**0.5]


def get_init_inputs():
    return []
