"""A KernelBench-format file whose sizes are written into get_inputs (nothing to shrink) and far
too large for the Triton interpreter: a CPU campaign must refuse it in seconds."""
import torch


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8192, 8192)

    def forward(self, x):
        return torch.relu(self.linear(x))


def get_inputs():
    return [torch.rand(1024, 8192)]


def get_init_inputs():
    return []
