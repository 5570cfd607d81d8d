from __future__ import annotations

import os
from pathlib import Path

import pytest

# Kernels run in the Triton interpreter wherever there is no GPU (set before triton is imported).
try:
    import torch

    _CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover
    _CUDA = False
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
elif os.environ.get("PYTEST_XDIST_WORKER_COUNT") and "KERNELLAB_GPU_BYTES" not in os.environ:
    # each xdist worker's sandbox admits jobs against its own budget: split the card between them,
    # so that the parallel suite cannot oversubscribe it (the bigmem tests run alone, on the whole card)
    _n = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["KERNELLAB_GPU_BYTES"] = str(int(torch.cuda.get_device_properties(0).total_memory * 0.92) // _n)

ROOT = Path(__file__).resolve().parent.parent
PROBLEMS = ROOT / "experiments" / "problems"


def pytest_collection_modifyitems(config, items):
    if _CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run scripts/gpu_check.sh on the GPU host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def root() -> Path:
    return ROOT
