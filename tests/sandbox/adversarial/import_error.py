# expect: compile_error import
import kernellab_no_such_module
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    pass
