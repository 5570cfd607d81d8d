"""bf16 GEMM through nn.Linear (no bias): 8192 tokens, 8192 -> 8192 features.

Eager H200 estimate: 2*8192^3 = 1.1 TFLOP at bf16 ~700 TFLOP/s ~ 1.6 ms.
"""

import torch

DTYPE = "bfloat16"

tokens = 8192
in_features = 8192
out_features = 8192

SMALL = {"tokens": 33, "in_features": 64, "out_features": 127}


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features, bias=False)

    def forward(self, x):
        return self.proj(x)


def get_inputs():
    return [torch.randn(tokens, in_features)]


def get_init_inputs():
    return [in_features, out_features]
