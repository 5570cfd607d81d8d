# expect: correct
# gpu
# A correct CUDA C++ kernel through CuPy (tensors passed by data_ptr, launched on torch's stream).
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x * 2.0) + 1.0


import cupy

_SRC = r'''
extern "C" __global__ void relu2_cupy(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i] * 2.0f, 0.0f) + 1.0f;
}
'''
_K = None


class ModelNew(Model):
    def forward(self, x):
        global _K
        if _K is None:
            _K = cupy.RawModule(code=_SRC).get_function('relu2_cupy')
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
        with stream:
            _K(((n + 255) // 256,), (256,), (x.data_ptr(), y.data_ptr(), cupy.int32(n)))
        return y
