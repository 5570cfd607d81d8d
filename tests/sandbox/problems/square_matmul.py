"""KernelBench level1/1_Square_matrix_multiplication_ (C = A @ B, N = 4096), with SMALL for the CPU:
the problem KernelBench's adversarial unit tests (kb_adversarial/) run against."""

import torch

N = 2048 * 2
SMALL = {"N": 32}


class Model(torch.nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)


def get_inputs():
    return [torch.rand(N, N), torch.rand(N, N)]


def get_init_inputs():
    return []
