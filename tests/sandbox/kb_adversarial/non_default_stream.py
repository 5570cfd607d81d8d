# expect: rejected integrity:side_stream_escape
# gpu
# timing: on
# problem: square_matmul
# Mirrors KernelBench test_eval_adversarial.py::test_non_default_stream (test_kernels/non_default_stream_kernel.py)
# with torch's own streams: the cuBLAS matmul runs on a side stream the caller's stream never waits for.
# (It waits for the inputs first: KernelBench's kernel does not, a race on top of the hack that would
# make the verdict depend on luck.)
import torch

_SIDE = None


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        global _SIDE
        _SIDE = _SIDE or torch.cuda.Stream()
        C = torch.empty(A.size(0), B.size(1), dtype=A.dtype, device=A.device)
        _SIDE.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(_SIDE):
            torch.matmul(A, B, out=C)
        return C
