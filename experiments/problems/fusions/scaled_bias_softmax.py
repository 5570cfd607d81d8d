"""Attention-score softmax with a scale and a learned additive bias per head (no mask): softmax(s * scale + bias).

Eager H200 estimate: mul, add, softmax ~ 24 B/elem * 268M = 6.4 GB (+ bias reads ~1 GB) at ~4.2 TB/s ~ 1.8 ms.
"""

import torch

batch = 4
heads = 16
seq = 2048
head_dim = 64

SMALL = {"batch": 2, "heads": 3, "seq": 33, "head_dim": 8}


class Model(torch.nn.Module):
    def __init__(self, heads, seq, head_dim):
        super().__init__()
        self.scale = head_dim**-0.5
        self.bias = torch.nn.Parameter(0.5 * torch.randn(heads, seq, seq))

    def forward(self, scores):
        return torch.softmax(scores * self.scale + self.bias, dim=-1)


def get_inputs():
    # Raw q.k scores have a standard deviation of about sqrt(head_dim).
    return [torch.randn(batch, heads, seq, seq) * head_dim**0.5]


def get_init_inputs():
    return [heads, seq, head_dim]
