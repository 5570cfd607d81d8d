# expect: crash signal:SIGSEGV
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import ctypes


class ModelNew(Model):
    def forward(self, x):
        ctypes.memset(0xDEAD00000000, 0, 64)  # a write to an unmapped address
        return x
