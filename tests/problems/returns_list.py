"""A bad problem: Model.forward returns a list of floats, not tensors (wrong at any size). No SMALL,
and sizes to shrink, so the small instance is derived."""
import torch

batch_size = 1024
dim = 4096


class Model(torch.nn.Module):
    def forward(self, x):
        return x.sum(dim=1).tolist()


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
