# expect: incorrect mismatch
# Computes in fp16 inside an fp32 problem: beyond the 1e-4 tolerance.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    def forward(self, x):
        return (torch.relu(x.half() * 2.0) + 1.0).float()
