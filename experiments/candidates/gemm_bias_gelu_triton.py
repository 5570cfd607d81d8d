"""A hand-written Triton candidate for experiments/problems/fusions/gemm_bias_gelu.py.

y = gelu(x @ W^T + b) * scale in one kernel: a tiled GEMM whose epilogue adds the bias, applies the
exact (erf) GELU and scales, so the GEMM result never goes back to memory before the epilogue.
"""

import torch
import triton
import triton.language as tl

# PRECISION "ieee" keeps fp32 accuracy (the problem's tolerance is 1e-4); "tf32x3" uses tensor cores
# with three TF32 products, close to fp32 accuracy and faster on Hopper.
CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_M": 8, "PRECISION": "ieee", "num_warps": 4,
          "num_stages": 3}
SPACE = {"BLOCK_M": [32, 64, 128], "BLOCK_N": [32, 64, 128], "BLOCK_K": [16, 32, 64], "GROUP_M": [1, 4, 8],
         "PRECISION": ["ieee", "tf32x3"], "num_warps": [4, 8], "num_stages": [2, 3, 4]}


@triton.jit
def gemm_bias_gelu_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K, scale,
                          stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                          GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    # grouped ordering: neighbouring programs share rows of x in L2
    group = GROUP_M * num_n
    first_m = (pid // group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % group) % size_m
    pid_n = (pid % group) // size_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        # W is (N, K): load a (BLOCK_K, BLOCK_N) tile of W^T
        b = tl.load(w_ptr + rn[None, :] * stride_wn + kk[:, None] * stride_wk,
                    mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    z = acc + bias[None, :]
    y = 0.5 * z * (1.0 + tl.math.erf(z * 0.7071067811865476)) * scale
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, y,
             mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm_bias_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, scale: float) -> torch.Tensor:
    assert x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1] and b.shape == (w.shape[0],)
    M, K = x.shape
    N = w.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    c = CONFIG
    grid = (triton.cdiv(M, c["BLOCK_M"]) * triton.cdiv(N, c["BLOCK_N"]),)
    gemm_bias_gelu_kernel[grid](x, w, b, y, M, N, K, float(scale),
                                x.stride(0), x.stride(1), w.stride(0), w.stride(1), y.stride(0), y.stride(1),
                                BLOCK_M=c["BLOCK_M"], BLOCK_N=c["BLOCK_N"], BLOCK_K=c["BLOCK_K"],
                                GROUP_M=c["GROUP_M"], PRECISION=c["PRECISION"],
                                num_warps=c["num_warps"], num_stages=c["num_stages"])
    return y


class Model(torch.nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.nn.functional.gelu(self.linear(x)) * self.scale


class ModelNew(Model):
    def forward(self, x):
        return gemm_bias_gelu(x, self.linear.weight, self.linear.bias, self.scale)
