from __future__ import annotations

import os
from pathlib import Path

import pytest

# On a host of several GPUs (scripts/gpu_check.sh exports KERNELLAB_TEST_GPUS, e.g. "0,1"), each xdist worker
# takes one of them round-robin. It must be set before CUDA is first touched, hence before the check below.
_gpus = [g for g in os.environ.get("KERNELLAB_TEST_GPUS", "").split(",") if g.strip()]
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if len(_gpus) > 1 and _worker.startswith("gw"):
    os.environ["CUDA_VISIBLE_DEVICES"] = _gpus[int(_worker[2:]) % len(_gpus)].strip()

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
    _n = -(-int(os.environ["PYTEST_XDIST_WORKER_COUNT"]) // max(1, len(_gpus)))  # workers sharing this card
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
