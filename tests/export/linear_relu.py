"""Linear + ReLU: y = relu(x @ W^T + b). A tiny problem for the export round-trip test."""

import torch

batch_size = 256
in_features = 512
out_features = 1024

SMALL = {"batch_size": 8, "in_features": 32, "out_features": 65}


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
