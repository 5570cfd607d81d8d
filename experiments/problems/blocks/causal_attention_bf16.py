"""Causal multi-head self-attention in bf16 with plain matmuls, a boolean mask buffer and softmax (no SDPA).

Eager H200 estimate: ~1.7 ms = 412 GFLOP at bf16 700 TFLOP/s (0.6) + scale, mask, softmax on 268M scores, 4.6 GB (1.1).
"""

import torch

DTYPE = "bfloat16"
# The eager bf16 reference rounds scores, probabilities and head outputs to bf16; against an exact
# computation its own error reached 0.8 of the default 1e-2 on 0.5M outputs (CPU), and the tail grows with
# the full size's 17M outputs. 2e-2 keeps an exact kernel passing; the sandbox's relative-norm check still binds.
ATOL = 2e-2

batch = 4
seq = 2048
dim = 2048
heads = 16

SMALL = {"batch": 2, "seq": 33, "dim": 48, "heads": 3}


class Model(torch.nn.Module):
    def __init__(self, dim, heads, max_seq):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, dim)
        self.register_buffer("mask", torch.ones(max_seq, max_seq, dtype=torch.bool).triu(1), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        head_dim = d // self.heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) * head_dim**-0.5
        scores = scores.masked_fill(self.mask[:s, :s], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        y = (probs @ v).transpose(1, 2).reshape(b, s, d)
        return self.out(y)


def get_inputs():
    # Scale 2 keeps attention from being near-uniform (outputs O(0.1), not O(0.01)); at scale 3 the bf16
    # reference's own rounding of the scores already exceeds the 1e-2 tolerance against an exact result.
    return [2.0 * torch.randn(batch, seq, dim)]


def get_init_inputs():
    return [dim, heads, seq]
