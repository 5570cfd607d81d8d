# expect: correct
# timing: on
# Caches by address and the first values, and is slow (20 ms) whenever it computes: correct, but what
# the timing reports must be its real cost, which only fresh values before every timed repetition show.
import time

import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


_CACHE = {}
SLOW_S = 0.02


class ModelNew(Model):
    def forward(self, x):
        key = (x.data_ptr(), tuple(x.shape), tuple(x.reshape(-1)[:8].tolist()))
        if key not in _CACHE:
            time.sleep(SLOW_S)
            _CACHE[key] = torch.relu(x * 2.0) + 1.0
        return _CACHE[key].clone()
