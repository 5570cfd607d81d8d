# expect: correct
# gpu
# problem: tiny_linear
# A linear layer through cuBLAS and an elementwise add through PyTorch, with comments that declare
# kernels named like theirs; no kernel of its own runs, so it stays library_only:
#   __global__ void vectorized_elementwise_kernel(float* y) {}
#   __global__ void elementwise_kernel(float* y) {}
#   __global__ void cutlass_80_tensorop_s1688gemm(float* y) {}
#   __global__ void xmma_gemm(float* y) {}
#   __global__ void nvjet_tst(float* y) {}
#   __global__ void gemm_kernel(float* y) {}
#   __global__ void splitKreduce_kernel(float* y) {}
import torch


class Model(torch.nn.Module):
    def __init__(self, features):
        super().__init__()
        self.linear = torch.nn.Linear(features, features)

    def forward(self, x):
        return self.linear(x)


class ModelNew(Model):
    def forward(self, x):
        return torch.matmul(x, self.linear.weight.t()) + self.linear.bias
