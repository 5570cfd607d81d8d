"""The process Nsight Compute profiles: ``python -m kernellab.sandbox._profile_target JOBDIR``.

Builds the reference instance and the candidate (seeded alike), compiles with two warm-up calls,
then runs exactly one forward between ``cudaProfilerStart`` and ``cudaProfilerStop``."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path


def main() -> None:
    import torch

    from kernellab.problem import apply_mode, instantiate

    from ._worker import load_module

    jobdir = Path(sys.argv[1])
    job = pickle.loads((jobdir / "job.pkl").read_bytes())
    os.chdir(jobdir)
    dev = torch.device("cuda", 0)
    inst = instantiate(job["problem"], small=bool(job["small"]), seed=1234, device=dev)
    mod = load_module(job["source"], jobdir, "kernellab_profiled_candidate")
    if job.get("config"):
        mod.CONFIG.update(job["config"])
    torch.manual_seed(1234)
    model = apply_mode(mod.ModelNew(*inst.init_inputs).to(device=dev, dtype=inst.dtype), job["problem"].mode)
    with torch.no_grad():
        for _ in range(2):
            model(*inst.inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        model(*inst.inputs)
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
