"""A pre-norm transformer block, fp32: x + attn(ln1(x)), then + mlp(ln2(x)); attention with plain matmuls.

Eager H200 estimate: ~1.5 ms = 60 GFLOP at fp32 51 TFLOP/s (1.2) + softmax, norms, GELU, adds, ~1.3 GB (0.3).
"""

import torch

batch = 2
seq = 1024
dim = 1024
heads = 16
mlp_ratio = 4

SMALL = {"batch": 2, "seq": 33, "dim": 48, "heads": 3}


class SelfAttention(torch.nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        head_dim = d // self.heads
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
        probs = torch.softmax((q @ k.transpose(-2, -1)) * head_dim**-0.5, dim=-1)
        return self.proj((probs @ v).transpose(1, 2).reshape(b, s, d))


class Model(torch.nn.Module):
    def __init__(self, dim, heads, mlp_ratio):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.ln2 = torch.nn.LayerNorm(dim)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(dim, mlp_ratio * dim),
            torch.nn.GELU(),
            torch.nn.Linear(mlp_ratio * dim, dim),
        )
        # Trained-looking norm parameters (not the identity), so a kernel cannot skip them; the larger
        # ln1 scale also keeps attention from being near-uniform.
        with torch.no_grad():
            for ln, lo, hi in ((self.ln1, 1.5, 2.5), (self.ln2, 0.5, 1.5)):
                ln.weight.uniform_(lo, hi)
                ln.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def get_inputs():
    return [torch.randn(batch, seq, dim)]


def get_init_inputs():
    return [dim, heads, mlp_ratio]
