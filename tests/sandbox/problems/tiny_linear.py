"""Test problem with weights: y = x @ W^T + b (checks seeding of Model and ModelNew alike)."""

import torch

batch = 16
features = 33
SMALL = {"batch": 5, "features": 17}


class Model(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        return self.linear(x)


def get_inputs():
    return [torch.randn(batch, features)]


def get_init_inputs():
    return [features]
