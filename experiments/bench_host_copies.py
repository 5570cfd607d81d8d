"""What a reference output's trip to the host and back costs on this GPU, by the way it is made: the numbers
behind where the sandbox keeps reference outputs (issue 31: at KernelBench's level-1 sizes,
``reference.parts_s.to_host`` was 22-25 s of a 28-32 s reference).

    python experiments/bench_host_copies.py [--gb 6.4] [--out FILE.json]
    THP_MEM_ALLOC_ENABLE=1 python experiments/bench_host_copies.py ...   # torch's CPU allocator on huge pages

The environment's ``THP_MEM_ALLOC_ENABLE`` (read by torch when it loads: run once without, once with, for the
side by side) and the host's transparent-huge-page setting are recorded with the numbers.

Each way is timed on one tensor of ``--gb`` gigabytes (float32), the device synchronised around it:
``pageable`` (``.to("cpu")``, as the sandbox copies today: fresh host pages), ``pinned_alloc`` and
``pinned_copy`` (a page-locked buffer from torch's caching host allocator, then the copy), ``pinned_again``
(the same after the first buffer was freed: the allocator's cache), ``h2d_*`` (the check's way back, in the
sandbox's compare chunks), ``fingerprint`` (the sandbox's print of the tensor where it lives: what keeping it
on the device costs to vouch for it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _timed(fn, dev) -> tuple[float, object]:
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    out = fn()
    torch.cuda.synchronize(dev)
    return time.perf_counter() - t0, out


def _back(h: torch.Tensor, dev: torch.device, chunk: int) -> None:
    for lo in range(0, h.numel(), chunk):
        h[lo:lo + chunk].to(dev)


def _host_thp() -> str | None:
    """The kernel's transparent-huge-page mode (the bracketed word of its setting), None where unreadable."""
    try:
        text = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return None
    return text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, default=6.4)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_host_copies: no CUDA device", file=sys.stderr)
        return 2
    from kernellab.sandbox._check import _CHUNK
    from kernellab.sandbox._reference import _fingerprint

    dev = torch.device("cuda")
    n = int(a.gb * 1e9) // 4
    x = torch.randn(n, device=dev)
    gb = n * 4 / 1e9
    r: dict = {"gb": round(gb, 3), "device": torch.cuda.get_device_name(dev), "torch": torch.__version__,
               "host_empty_cache_api": hasattr(torch._C, "_host_emptyCache"),
               "thp_mem_alloc_enable": os.environ.get("THP_MEM_ALLOC_ENABLE"), "host_thp": _host_thp()}
    s, h = _timed(lambda: x.to("cpu"), dev)
    r["pageable_s"] = s
    s, _ = _timed(lambda: _back(h, dev, _CHUNK), dev)
    r["h2d_pageable_s"] = s
    h = None  # freed before the next way is timed
    s, _ = _timed(lambda: x.to("cpu"), dev)  # freed before the next way is timed
    r["pageable_again_s"] = s
    s, p = _timed(lambda: torch.empty(n, dtype=x.dtype, pin_memory=True), dev)
    r["pinned_alloc_s"] = s
    s, _ = _timed(lambda: p.copy_(x), dev)
    r["pinned_copy_s"] = s
    s, _ = _timed(lambda: _back(p, dev, _CHUNK), dev)
    r["h2d_pinned_s"] = s
    p = None  # freed before the next way is timed
    s, p2 = _timed(lambda: torch.empty(n, dtype=x.dtype, pin_memory=True), dev)
    r["pinned_again_alloc_s"] = s
    s, _ = _timed(lambda: p2.copy_(x), dev)
    r["pinned_again_copy_s"] = s
    p2 = None  # freed before the next way is timed
    if r["host_empty_cache_api"]:
        s, _ = _timed(torch._C._host_emptyCache, dev)
        r["host_empty_cache_s"] = s
    s, _ = _timed(lambda: _fingerprint([x]), dev)
    r["fingerprint_device_s"] = s
    s, _ = _timed(lambda: x.clone(), dev)
    r["d2d_clone_s"] = s
    for k in list(r):
        if k.endswith("_s"):
            r[k] = round(r[k], 3)
            if k not in ("host_empty_cache_s", "fingerprint_device_s"):
                r[k.replace("_s", "_gb_per_s")] = round(gb / max(r[k], 1e-9), 2)
    print(json.dumps(r, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(r, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
