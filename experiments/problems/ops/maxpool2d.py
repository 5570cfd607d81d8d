"""Max pooling 3x3, stride 2, padding 1 (the ResNet stem pool) on 112x112 feature maps.

Eager H200 estimate: read 192*256*112*112*4 B = 2.5 GB + write 0.6 GB at ~4.2 TB/s ~ 0.73 ms.
"""

import torch

batch = 192
channels = 256
size = 112

SMALL = {"batch": 2, "channels": 3, "size": 33}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pool = torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)

    def forward(self, x):
        return self.pool(x)


def get_inputs():
    return [torch.randn(batch, channels, size, size)]


def get_init_inputs():
    return []
