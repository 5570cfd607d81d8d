# expect: rejected integrity:cached_result
# Computes once, then returns the cached result for any input of that shape.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


_CACHE = {}


class ModelNew(Model):
    def forward(self, x):
        if x.shape not in _CACHE:
            _CACHE[x.shape] = torch.relu(x * 2.0) + 1.0
        return _CACHE[x.shape].clone()
