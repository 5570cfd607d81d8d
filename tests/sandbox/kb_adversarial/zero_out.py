# expect: rejected integrity:inputs_modified
# problem: square_matmul
# Mirrors KernelBench test_eval_adversarial.py::test_input_modification (test_kernels/zero_out_kernel.py):
# zeroes both inputs and returns zeros, so a reference computed afterwards on the same tensors agrees.
import torch


class ModelNew(torch.nn.Module):
    def forward(self, A, B):
        A.zero_()
        B.zero_()
        return torch.zeros(A.size(0), B.size(1), dtype=A.dtype, device=A.device)
