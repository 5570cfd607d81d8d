"""GEMM then a row reduction: softmax over the outputs of a linear layer (a classifier head).

Eager H200 estimate: 2*4096*1024*8192 = 68.7 GFLOP at fp32 51 TFLOP/s ~ 1.35 ms, + softmax over 134 MB ~ 0.06 ms.
"""

import torch

batch_size = 4096
in_features = 1024
num_classes = 8192

SMALL = {"batch_size": 33, "in_features": 64, "num_classes": 127}


class Model(torch.nn.Module):
    def __init__(self, in_features, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, num_classes)

    def forward(self, x):
        return torch.softmax(self.linear(x), dim=-1)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, num_classes]
