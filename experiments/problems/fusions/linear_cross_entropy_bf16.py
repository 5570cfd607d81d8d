"""GEMM then a row reduction in bf16: LM head then cross-entropy (mean over tokens); never needs the logits.

Eager H200 estimate: ~2 ms = 2*8192*2048*32000 = 1.07 TFLOP at bf16 700 TFLOP/s (1.5) + ~4 passes over 0.5 GB logits (0.5).
"""

import torch

DTYPE = "bfloat16"

tokens = 8192
hidden = 2048
vocab = 32000

SMALL = {"tokens": 33, "hidden": 64, "vocab": 1000}


class Model(torch.nn.Module):
    def __init__(self, hidden, vocab):
        super().__init__()
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, x, target):
        return torch.nn.functional.cross_entropy(self.lm_head(x), target)


def get_inputs():
    return [torch.randn(tokens, hidden), torch.randint(0, vocab, (tokens,))]


def get_init_inputs():
    return [hidden, vocab]
