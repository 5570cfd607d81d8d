"""Problems whose references KernelBench's own eval fails: shared by the control's and the cross-check's tests.

DROPOUT draws random numbers (KernelBench draws them twice without a reseed, so the reference fails itself
unless p is 0); TARGETS takes class indices, which KernelBench casts to the float precision.
"""

DROPOUT = """import torch


class Model(torch.nn.Module):
    def __init__(self, p):
        super().__init__()
        self.drop = torch.nn.Dropout(p)

    def forward(self, x):
        return torch.softmax(self.drop(x), dim=1)


def get_inputs():
    return [torch.rand(16, 64)]


def get_init_inputs():
    return [{p}]
"""

TARGETS = """import torch


class Model(torch.nn.Module):
    def forward(self, x, t):
        return torch.nn.functional.cross_entropy(x, t)


def get_inputs():
    return [torch.rand(4, 5), torch.randint(0, 5, (4,))]


def get_init_inputs():
    return []
"""
