"""Skinny fp32 GEMM: a decode-time LM head, 16 tokens times an 8192 x 98304 weight (nn.Linear, no bias).

Eager H200 estimate: weight read 3.2 GB at ~4.2 TB/s ~ 0.77 ms (25.8 GFLOP at 51 TFLOP/s ~ 0.5 ms overlaps).
"""

import torch

tokens = 16
hidden = 8192
vocab = 98304

SMALL = {"tokens": 1, "hidden": 64, "vocab": 127}


class Model(torch.nn.Module):
    def __init__(self, hidden, vocab):
        super().__init__()
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, x):
        return self.lm_head(x)


def get_inputs():
    return [torch.randn(tokens, hidden)]


def get_init_inputs():
    return [hidden, vocab]
