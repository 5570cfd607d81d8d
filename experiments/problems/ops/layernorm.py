"""LayerNorm over the hidden dimension (nn.LayerNorm with trained-looking affine parameters).

Eager H200 estimate: read + write 24*4096*4096*4 B = 3.2 GB at ~4.2 TB/s ~ 0.77 ms.
"""

import torch

batch = 24
seq = 4096
hidden = 4096

SMALL = {"batch": 2, "seq": 33, "hidden": 127}


class Model(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        # Not the identity affine (weight 1, bias 0): a kernel that skips it must fail the check.
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(batch, seq, hidden)]


def get_init_inputs():
    return [hidden]
