# expect: runtime_error oom
# device: cpu
# Allocates until out of memory (the CPU worker has an address-space limit).
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


_HOARD = []


class ModelNew(Model):
    def forward(self, x):
        while True:
            _HOARD.append(torch.empty(1 << 28, dtype=torch.float32))
