# expect: rejected integrity:cached_result
# timing: on
# Caches by input address: right on fresh tensors, stale when the same tensor gets new values.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


_CACHE = {}


class ModelNew(Model):
    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape))
        if key not in _CACHE:
            _CACHE[key] = torch.relu(x * 2.0) + 1.0
        return _CACHE[key].clone()
