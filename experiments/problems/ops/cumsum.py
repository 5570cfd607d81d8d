"""Inclusive prefix sum (scan) along rows of 8192.

Eager H200 estimate: read + write 49152*8192*4 B = 3.2 GB at ~4.2 TB/s ~ 0.77 ms (eager scans run below peak).
"""

import torch

# torch's own fp32 scan is not within the default 1e-4 of an exact one at 8192 columns: on the H200 the
# builtin's seed summing in fp64 (exact to one rounding) differed from torch.cumsum by 1.04e-4 at
# element [108, 5687] of the seeded input (2504 of 402653184 elements beyond 1e-4), where a fp32 seed
# in another order had differed by 1.12e-4. The reference's own error sets the tolerance.
ATOL = 3e-4
rows = 49152
cols = 8192

SMALL = {"rows": 33, "cols": 127}


class Model(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x, dim=1)


def get_inputs():
    return [torch.randn(rows, cols)]


def get_init_inputs():
    return []
