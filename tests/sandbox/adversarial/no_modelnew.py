# expect: compile_error missing_modelnew
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNw(Model):
    pass
