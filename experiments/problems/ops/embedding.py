"""Embedding lookup (a gather of rows): 12x4096 token ids into a 32000 x 8192 fp32 table.

Eager H200 estimate: gather 403M elements: read 1.6 GB + write 1.6 GB at ~4.2 TB/s ~ 0.77 ms.
"""

import torch

batch = 12
seq = 4096
vocab = 32000
hidden = 8192

SMALL = {"batch": 2, "seq": 33, "vocab": 127, "hidden": 65}


class Model(torch.nn.Module):
    def __init__(self, vocab, hidden):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)

    def forward(self, ids):
        return self.embed(ids)


def get_inputs():
    return [torch.randint(0, vocab, (batch, seq))]


def get_init_inputs():
    return [vocab, hidden]
