"""A tiny pointwise problem for the LLM campaign tests: y = 2x + 1 (one read, one write)."""

import torch

N = 1 << 24

SMALL = {"N": 257}


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
