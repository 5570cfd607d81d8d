"""log_softmax over a vocabulary of 32000 (not a power of two), as before a language-model loss.

Eager H200 estimate: read + write 12288*32000*4 B = 3.1 GB at ~4.2 TB/s ~ 0.75 ms.
"""

import torch

tokens = 12288
vocab = 32000

SMALL = {"tokens": 33, "vocab": 1000}


class Model(torch.nn.Module):
    def forward(self, logits):
        return torch.nn.functional.log_softmax(logits, dim=-1)


def get_inputs():
    return [torch.randn(tokens, vocab)]


def get_init_inputs():
    return []
