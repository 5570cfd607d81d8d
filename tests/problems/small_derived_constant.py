"""SMALL names the sizes only; ``bias_shape`` is computed from them and must follow."""
import torch

batch_size = 64
out_channels = 128
bias_shape = (out_channels, 1, 1)
SMALL = {"batch_size": 2, "out_channels": 4}


class Model(torch.nn.Module):
    def __init__(self, bias_shape):
        super().__init__()
        self.bias = torch.nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        return x + self.bias


def get_inputs():
    return [torch.randn(batch_size, out_channels, 3, 3)]


def get_init_inputs():
    return [bias_shape]
