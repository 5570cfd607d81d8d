# expect: correct
# Correct plain PyTorch: valid, but library_only (no kernel of its own).
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    def forward(self, x):
        return (x * 2.0).clamp_min(0.0) + 1.0
