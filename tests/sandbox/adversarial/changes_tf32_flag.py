# expect: rejected integrity:global_state_changed
# Turns TF32 on globally, which would change what the reference computes.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    def forward(self, x):
        torch.backends.cuda.matmul.allow_tf32 = True
        return torch.relu(x * 2.0) + 1.0
