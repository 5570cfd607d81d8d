# expect: crash exit:7
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import os


class ModelNew(Model):
    def forward(self, x):
        os._exit(7)
