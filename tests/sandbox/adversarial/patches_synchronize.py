# expect: rejected integrity:timing_patched
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


torch.cuda.synchronize = lambda *a, **k: None


class ModelNew(Model):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0
