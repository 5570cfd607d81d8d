# expect: rejected integrity:side_stream_escape
# gpu
# timing: on
# problem: square_matmul
# Mirrors KernelBench test_eval_adversarial.py::test_non_default_stream (test_kernels/non_default_stream_kernel.py)
# closely: cuBLAS on a cudaStreamNonBlocking stream that torch knows nothing of, writing into a result
# torch allocated (tensors passed by pointer). It waits for the inputs through an event (KernelBench's
# kernel does not: a race that would make the verdict depend on luck).
import cupy
import torch

_STREAM = None


def _view(t):
    mem = cupy.cuda.UnownedMemory(t.data_ptr(), t.numel() * t.element_size(), t)
    return cupy.ndarray(tuple(t.shape), dtype=cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        global _STREAM
        _STREAM = _STREAM or cupy.cuda.Stream(non_blocking=True)
        A, B = A.contiguous(), B.contiguous()
        C = torch.empty(A.size(0), B.size(1), dtype=A.dtype, device=A.device)
        ready = cupy.cuda.Event()
        ready.record(cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))
        _STREAM.wait_event(ready)
        with _STREAM:
            cupy.matmul(_view(A), _view(B), out=_view(C))
        return C
