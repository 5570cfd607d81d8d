# expect: rejected integrity:output_aliases_input
# Writes the result into its input and returns it.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    def forward(self, x):
        return x.mul_(2.0).clamp_(min=0.0).add_(1.0)
