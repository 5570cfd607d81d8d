# expect: timeout timeout:compile
# limits: compile=6
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


class ModelNew(Model):
    def forward(self, x):
        while True:
            pass
