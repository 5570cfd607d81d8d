"""Where we run: device name and software versions, recorded with every evaluation and campaign."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from pathlib import Path


def has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def default_device() -> str:
    return "cuda" if has_cuda() else "cpu"


def device_name(device: str | None = None) -> str:
    device = device or default_device()
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({platform.processor() or platform.machine()}, Triton interpreter)"


def timings_compare(recorded: str | None, here: str) -> bool:
    """Whether results recorded on the device named ``recorded`` may be compared with new ones on ``here``
    (both as :func:`device_name` gives them): the same GPU model, or two CPUs (interpreted runs claim no speed)."""
    return not recorded or recorded == here or (recorded.startswith("cpu") and here.startswith("cpu"))


@functools.cache
def git_commit() -> str | None:
    # a copy without .git (e.g. the working tree sent to a GPU host) names its commit in the environment
    if os.environ.get("KERNELLAB_COMMIT"):
        return os.environ["KERNELLAB_COMMIT"]
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        if out.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return out.stdout.strip() + ("+dirty" if dirty else "")
    except Exception:
        return None


@functools.cache
def versions(device: str | None = None) -> dict:
    """Software versions; ``interpreter`` says whether Triton kernels run in its interpreter: always on
    a campaign's CPU device (the sandbox workers set TRITON_INTERPRET there; the runtime setup of the entry
    points, kernellab._runtime, sets it in a process without a CUDA device too)."""
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "kernellab": _kl_version(), "commit": git_commit()}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = None
    try:
        import cupy  # noqa: F401

        out["cupy"] = cupy.__version__
    except Exception:
        out["cupy"] = None
    if has_cuda():
        try:
            out["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except Exception:
            out["driver"] = None
    out["interpreter"] = os.environ.get("TRITON_INTERPRET") == "1" or (device or default_device()) == "cpu"
    return out


def _kl_version() -> str:
    from kernellab import __version__

    return __version__
