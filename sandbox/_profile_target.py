"""The process Nsight Compute profiles: ``python -m kernellab.sandbox._profile_target JOBDIR``.

Builds the reference instance and the candidate (seeded alike), compiles with two warm-up calls,
then runs exactly one forward between ``cudaProfilerStart`` and ``cudaProfilerStop``. Like a sandbox
worker it first drops the capabilities that would let candidate code read other processes' memory
and environment (``drop_inspect_caps``): profiling runs the candidate as evaluation does. Where the
driver restricts performance counters to admin users (``NVreg_RestrictProfilingToAdminUsers=1``),
ncu then reports ERR_NVGPUCTRPERM, which :func:`kernellab.sandbox.profile` turns into its
"lacks permission" reason rather than profiling a candidate with those capabilities."""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path


def main() -> None:
    from ._env import drop_inspect_caps

    drop_inspect_caps()  # before anything of the problem's or the candidate's runs
    import torch

    from kernellab.problem import apply_mode, instantiate
    from kernellab.vocab import SEED, apply_config

    from ._worker import load_module

    jobdir = Path(sys.argv[1])
    job = pickle.loads((jobdir / "job.pkl").read_bytes())
    os.chdir(jobdir)
    dev = torch.device("cuda", 0)
    inst = instantiate(job["problem"], small=bool(job["small"]), seed=SEED, device=dev)
    mod = load_module(job["source"], jobdir, "kernellab_profiled_candidate")
    # the sandbox's nested merge: a per-kernel config entry changes that kernel's named parameters only
    apply_config(getattr(mod, "CONFIG", None), job.get("config"), getattr(mod, "SPACE", None))
    torch.manual_seed(SEED)
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
