# expect: rejected integrity:torch_patched
# Replaces torch.relu for everyone, the reference included.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


torch.relu = lambda t: t.clamp_min(0.0)


class ModelNew(Model):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0
