# expect: rejected integrity:timing_patched
# Makes every CUDA event pair report 1 microsecond (detected without running CUDA).
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


torch.cuda.Event.elapsed_time = lambda self, end: 0.001


class ModelNew(Model):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0
