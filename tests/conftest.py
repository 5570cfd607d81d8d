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


def _passed_before(path: str) -> set[str]:
    """The node ids a KERNELLAB_TEST_REPORT file (below) says passed."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return set()
    # xdist's loadgroup adds "@group" to a grouped test's id
    return {f.split()[3].split("@")[0] for f in lines if f.startswith("PASSED ") and len(f.split()) >= 4}


def pytest_collection_modifyitems(config, items):
    # KERNELLAB_TESTS_DONE=FILE: a report of an earlier call (carried back to the GPU host); the tests it says
    # passed are left out, so that a suite longer than one device call goes on where the last call stopped
    done = os.environ.get("KERNELLAB_TESTS_DONE")
    if done:
        passed = _passed_before(done)
        keep = [i for i in items if i.nodeid.split("@")[0] not in passed]
        if len(keep) < len(items):
            config.hook.pytest_deselected(items=[i for i in items if i.nodeid.split("@")[0] in passed])
            items[:] = keep
    if _CUDA:
        _longest_first(items)
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run scripts/gpu_check.sh on the GPU host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Seconds each GPU test took in the last measured suite run (H200; tests/gpu_durations.json, written from a
# KERNELLAB_TEST_REPORT file); a test not listed counts this long.
_UNKNOWN_S = 60.0


def _longest_first(items: list) -> None:
    """Longest first, the rest in their order: xdist hands tests out in collection order, and a 250 s test
    handed out last kept 11 of 12 workers idle at the end of the call."""
    import json

    try:
        known = json.loads((Path(__file__).parent / "gpu_durations.json").read_text())
    except (OSError, ValueError):
        return
    items.sort(key=lambda i: -known.get(i.nodeid.split("@")[0], _UNKNOWN_S))  # sort is stable


@pytest.fixture
def root() -> Path:
    return ROOT


# KERNELLAB_TEST_REPORT=FILE: each test's outcome, duration and (for a failure) its traceback, written as the test
# ends. A GPU run cut off by the device call's limit never reaches pytest's summary; this file still says what failed
# and why, and which tests took the time. Under xdist this hook runs in the controller, one writer.
def pytest_runtest_logreport(report):
    path = os.environ.get("KERNELLAB_TEST_REPORT")
    if not path or _worker or (report.when != "call" and report.passed):
        return
    worker = getattr(report, "node", None)
    line = f"{report.outcome.upper():8} {report.duration:7.1f}s {report.when:8} {report.nodeid}"
    with open(path, "a") as f:
        f.write(line + (f" [{worker.gateway.id}]" if worker is not None else "") + "\n")
        if report.failed:
            f.write(report.longreprtext[-6000:] + "\n" + "-" * 80 + "\n")
