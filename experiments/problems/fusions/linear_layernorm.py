"""GEMM then a row reduction: LayerNorm over the outputs of a linear layer (a projection then norm).

Eager H200 estimate: 2*8192*2048*2048 = 68.7 GFLOP at fp32 51 TFLOP/s ~ 1.35 ms, + LayerNorm over 67 MB ~ 0.03 ms.
"""

import torch

tokens = 8192
in_features = 2048
out_features = 2048

SMALL = {"tokens": 33, "in_features": 64, "out_features": 127}


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.norm = torch.nn.LayerNorm(out_features)
        # Not the identity affine, so a kernel that skips it must fail the check.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(self.linear(x))


def get_inputs():
    return [torch.randn(tokens, in_features)]


def get_init_inputs():
    return [in_features, out_features]
