# expect: compile_error nvrtc
# gpu
# CUDA C++ that NVRTC refuses; the error text carries NVRTC's log.
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import cupy

_SRC = r'''
extern "C" __global__ void relu2(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i] * 2.0f, 0.0f) + 1.0f   // missing semicolon
}
'''


class ModelNew(Model):
    def forward(self, x):
        mod = cupy.RawModule(code=_SRC)
        k = mod.get_function('relu2')
        y = torch.empty_like(x)
        n = x.numel()
        k(((n + 255) // 256,), (256,), (x.data_ptr(), y.data_ptr(), cupy.int32(n)))
        return y
