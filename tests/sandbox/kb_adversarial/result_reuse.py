# expect: rejected integrity:stale_memory
# problem: square_matmul
# Mirrors KernelBench test_eval_adversarial.py::test_result_cache_reuse (test_kernels/result_reuse_kernel.py):
# allocates the result with empty() and computes nothing, hoping the allocator hands back the freed
# reference output.
import torch


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        return torch.empty(A.size(0), B.size(1), dtype=A.dtype, device=A.device)
