"""KernelBench level 3's 44_MiniGPTBlock in miniature: its MLP runs through a lambda over the MLP's modules, which
torch.fx cannot trace and torch.export lifts into constants of the graph (the weights under other names)."""
import torch
from torch import nn


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(dim, 4 * dim), c_proj=nn.Linear(4 * dim, dim)))
        m = self.mlp
        self.mlpf = lambda x: m.c_proj(torch.relu(m.c_fc(x)))

    def forward(self, x):
        return x + self.mlpf(self.ln(x))


batch_size = 2
seq_len = 4
dim = 8


def get_init_inputs():
    return [dim]


def get_inputs():
    return [torch.randn(batch_size, seq_len, dim)]
