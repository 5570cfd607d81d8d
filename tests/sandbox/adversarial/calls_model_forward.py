# expect: rejected integrity:reference_called
# Calls its copy of the reference Model.forward.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    def forward(self, x):
        return super().forward(x)
