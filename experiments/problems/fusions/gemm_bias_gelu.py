"""GEMM with a pointwise epilogue: y = gelu(x @ W^T + b) * scale.

Eager H200 estimate: 2*4096^3 = 137 GFLOP at fp32 51 TFLOP/s ~ 2.7 ms, + 2 pointwise passes over 64 MB ~ 0.06 ms.
"""

import torch

batch_size = 4096
in_features = 4096
out_features = 4096
scale = 0.5

SMALL = {"batch_size": 33, "in_features": 64, "out_features": 127}


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * self.scale


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
