"""A gated MLP (SwiGLU, Llama-style) in bf16: down(silu(gate(x)) * up(x)), 4096 -> 11008 -> 4096, no biases.

Eager H200 estimate: ~3.4 ms = 3*2*8192*4096*11008 = 2.2 TFLOP at bf16 700 TFLOP/s (3.2) + SiLU, product, 0.9 GB (0.2).
"""

import torch

DTYPE = "bfloat16"
# The eager bf16 reference rounds the gate and up projections to bf16 before the product; against an exact
# computation its own error reached 0.8 of the default 1e-2 on 0.5M outputs (CPU), and the tail grows with
# the full size's 34M outputs. 2e-2 keeps an exact kernel passing; the sandbox's relative-norm check still binds.
ATOL = 2e-2

batch = 4
seq = 2048
dim = 4096
hidden = 11008

SMALL = {"batch": 1, "seq": 33, "dim": 64, "hidden": 127}


class Model(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = torch.nn.Linear(dim, hidden, bias=False)
        self.up_proj = torch.nn.Linear(dim, hidden, bias=False)
        self.down_proj = torch.nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


def get_inputs():
    # Residual-stream scale 2: the product of two projections then stays O(1) and the bf16 tolerance meaningful.
    return [2.0 * torch.randn(batch, seq, dim)]


def get_init_inputs():
    return [dim, hidden]
