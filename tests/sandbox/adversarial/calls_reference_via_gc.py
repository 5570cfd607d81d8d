# expect: rejected integrity:reference_called
# Finds the sandbox's reference model through the garbage collector and calls it.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import gc


class ModelNew(Model):
    def forward(self, x):
        for o in gc.get_objects():
            if isinstance(o, torch.nn.Module) and type(o).__name__ == 'Model' and type(o) is not Model:
                return o(x)
        return super().forward(x)
