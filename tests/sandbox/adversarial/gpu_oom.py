# expect: runtime_error oom
# gpu
# Allocates device memory until CUDA runs out.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


_HOARD = []


class ModelNew(Model):
    def forward(self, x):
        while True:
            _HOARD.append(torch.empty(1 << 30, dtype=torch.float32, device=x.device))
