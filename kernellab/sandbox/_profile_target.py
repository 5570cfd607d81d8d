"""The process Nsight Compute profiles: ``python -m kernellab.sandbox._profile_target JOBDIR``.

Builds the reference instance and the candidate (seeded alike), compiles with two warm-up calls,
then runs exactly one forward between ``cudaProfilerStart`` and ``cudaProfilerStop``. With
``KERNELLAB_GPU_GATE=1`` (``GATE_ENV``, set by ``run_gated``) it asks its parent (:class:`kernellab.sandbox._api.ProfileGate`) for
the GPU twice: shared before it builds the problem there (its imports and its CUDA context hold nothing), and
alone before that forward: warm-up shares the GPU as correctness work does, only the profiled forward's replays
hold it alone. With ``KERNELLAB_PROFILE_AHEAD=1`` (``AHEAD_ENV``) it is started before its job exists
(:class:`kernellab.sandbox._profile.WarmTargets`): ncu's start, the imports and the context are behind it when
the job's ``job.pkl`` arrives. Like a sandbox
worker it first drops the capabilities that would let candidate code read other processes' memory
and environment (``drop_inspect_caps``): profiling runs the candidate as evaluation does. Where the
driver restricts performance counters to admin users (``NVreg_RestrictProfilingToAdminUsers=1``),
ncu then reports ERR_NVGPUCTRPERM, which :func:`kernellab.sandbox.profile` turns into its
"lacks permission" reason rather than profiling a candidate with those capabilities."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import pickle
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def main() -> None:
    from kernellab._runtime import setup

    from ._env import drop_inspect_caps

    setup()  # what every kernellab process sets before its work (the interpreter switch, the ast lock)
    drop_inspect_caps()  # before anything of the problem's or the candidate's runs
    import torch

    from kernellab.problem import apply_mode, instantiate
    from kernellab.vocab import SEED, apply_config

    from ._load import load_module

    jobdir = Path(sys.argv[1])
    os.chdir(jobdir)
    # the device: CUDA under ncu; the CPU (KERNELLAB_SANDBOX_DEVICE=cpu, the Triton interpreter) where a test runs
    # this process without a GPU
    dev = torch.device("cpu") if os.environ.get("KERNELLAB_SANDBOX_DEVICE") == "cpu" else torch.device("cuda", 0)
    steps = _Steps(jobdir)
    hold = gated_prepare(jobdir, dev.type)  # the context made and the compilers wrapped, nothing of the GPU held
    steps("context")
    if os.environ.get(AHEAD_ENV) == "1":  # started ahead of its job (WarmTargets): it waits for one, holding nothing
        await_job(jobdir)
        steps("idle")
    job = pickle.loads((jobdir / JOB).read_bytes())
    if hold is not None:
        hold.ask_share()
    steps("share")
    inst = instantiate(job["problem"], small=bool(job["small"]), seed=SEED, device=dev)
    steps("instantiate")
    mod = load_module(job["source"], jobdir, "kernellab_profiled_candidate")
    # the sandbox's nested merge: a per-kernel config entry changes that kernel's named parameters only
    apply_config(getattr(mod, "CONFIG", None), job.get("config"), getattr(mod, "SPACE", None))
    steps("load")
    torch.manual_seed(SEED)
    model = apply_mode(mod.ModelNew(*inst.init_inputs).to(device=dev, dtype=inst.dtype), job["problem"].mode)
    steps("model")
    cuda = dev.type == "cuda"
    with torch.no_grad():
        for i in range(2):
            model(*inst.inputs)
            if cuda:
                torch.cuda.synchronize()
            steps(f"forward{i + 1}")
        if hold is not None:  # the warm-up shared the GPU; the profiled forward waits until the parent has it alone
            ask(jobdir, GATE_READY, GATE_GO)
        if cuda:
            torch.cuda.profiler.start()
        model(*inst.inputs)
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
    if hold is not None:
        (jobdir / GATE_DONE).touch()


TARGET_STEPS = "target-steps.json"


class _Steps:
    """The target's wall seconds by step up to its warm state (``TARGET_STEPS`` in the job directory, rewritten
    after each step; the profile event's ``seconds.target``): ``context`` (the CUDA context and the compilers'
    imports, nothing held), ``idle`` (started ahead, waiting for its job), ``share``, then building the problem
    and the two warm-up forwards, shared. Under ncu the shared stretch had lasted 7-10 s for a few milliseconds of
    kernels: these said where (the compilers' imports, since moved before the share)."""

    def __init__(self, jobdir: Path) -> None:
        self.path, self.t, self.s = jobdir / TARGET_STEPS, time.monotonic(), {}

    def __call__(self, name: str) -> None:
        now = time.monotonic()
        self.s[name] = round(now - self.t, 3)
        self.t = now
        self.path.write_text(json.dumps(self.s))


# files in the job directory, each pair a request and its grant: the target is about to use the GPU and the
# parent shares it; the target is warm and the parent has the GPU alone; then the target says the profiled
# forward is over (ncu's own start-up and report writing need no GPU of ours)
GATE_ENV = "KERNELLAB_GPU_GATE"  # "1" in a process run_gated gates: it asks before it uses the GPU
GATE_SHARE, GATE_SHARED = "gate-share", "gate-shared"
GATE_READY, GATE_GO, GATE_DONE = "gate-ready", "gate-go", "gate-done"
GATE_WAIT_S = 900.0
# numbered (``.format(k)``): host-only work begins without the share; it ends, the share asked for again
GATE_OFF, GATE_ON, GATE_ON_GRANTED = "gate-off-{}", "gate-on-{}", "gate-on-granted-{}"


class GpuHold:
    """A gated process's side of ``run_gated``'s share once granted: :meth:`off` around host-only work (a
    compiler), so that a timing waiting for the GPU does not wait for it, and :meth:`on_for` for what must
    hold the GPU inside such work (a compiler's own benchmarks). The device is synchronised before the share
    is given up, so none of this process's queued kernels runs while another job times."""

    def __init__(self, jobdir: Path, shared: bool = True) -> None:
        self.jobdir, self.shared, self.k = jobdir, shared, 0

    def release(self) -> bool:
        if not self.shared:
            return False
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        (self.jobdir / GATE_OFF.format(self.k)).touch()
        self.shared = False
        return True

    def ask_share(self) -> None:
        """The first share (``GATE_SHARE``): asked for once the process has its job, its set-up done."""
        if not self.shared:
            ask(self.jobdir, GATE_SHARE, GATE_SHARED)
            self.shared = True

    def take(self) -> None:
        if self.shared:
            return
        ask(self.jobdir, GATE_ON.format(self.k), GATE_ON_GRANTED.format(self.k))
        self.k += 1
        self.shared = True

    @contextlib.contextmanager
    def off(self) -> Iterator[None]:
        released = self.release()
        try:
            yield
        finally:
            if released:
                self.take()

    def off_for(self, fn: Callable) -> Callable:
        """``fn`` run inside :meth:`off` (:func:`kernellab.sandbox._compilers.release_for_inductor` wraps with it)."""

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.off():
                return fn(*args, **kwargs)

        call._kernellab_off_gpu = True
        return call

    def on_for(self, fn: Callable) -> Callable:
        """``fn`` with the share held: asked for again (and given up after) when called inside :meth:`off`."""

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            if self.shared:
                return fn(*args, **kwargs)
            self.take()
            try:
                return fn(*args, **kwargs)
            finally:
                self.release()

        return call


def gated_prepare(jobdir: Path, device: str) -> GpuHold | None:
    """In a gated process (``GATE_ENV``), before it asks for the GPU: its CUDA context made (the driver's set-up,
    seconds under ncu, and no kernel: a sandbox worker starts alike while another job times) and the compilers
    wrapped (Triton, Inductor and NVRTC to run without the share, Inductor's benchmarks with it:
    :func:`kernellab.sandbox._compilers.release_for_compiles`), all holding nothing. Its hold, not yet shared
    (:meth:`GpuHold.ask_share`), or None when the process is not gated. Wrapping imports Inductor, Triton and
    CuPy: done under the share, it held the GPU 5.9 s of a solo profile's 7.2 s shared stretch on the H200, which
    every timing arriving meanwhile waited out, with the readers queued behind it."""
    if os.environ.get(GATE_ENV) != "1":
        return None
    if device.startswith("cuda"):
        import torch

        torch.empty(1, device=device)  # an allocation makes the context; no kernel runs
    hold = GpuHold(jobdir, shared=False)
    from ._compilers import release_for_compiles

    release_for_compiles(hold.off_for, hold.on_for)
    return hold


def gated_share(jobdir: Path, device: str) -> GpuHold | None:
    """:func:`gated_prepare`, then the share asked for: the GPU from here on, shared, compiles apart."""
    hold = gated_prepare(jobdir, device)
    if hold is not None:
        hold.ask_share()
    return hold


JOB = "job.pkl"  # the job, in the job directory: written before the process starts, or later (``AHEAD_ENV``)
AHEAD_ENV = "KERNELLAB_PROFILE_AHEAD"  # "1": started ahead of its job, which it waits for (``WarmTargets``)
PARENT_ENV = "KERNELLAB_PROFILE_PARENT"  # the pid of the process that hands it its job


def await_job(jobdir: Path, poll_s: float = 0.02) -> None:
    """Wait for ``JOB`` in ``jobdir`` (written whole, then renamed into place); exit once the process that would
    write it is gone (ncu, between, does not end its target when its own parent dies)."""
    parent = int(os.environ.get(PARENT_ENV) or 0)
    checked = time.monotonic()
    while not (jobdir / JOB).exists():
        if parent and time.monotonic() - checked > 1.0:
            checked = time.monotonic()
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                raise SystemExit("kernellab: the profile's parent is gone") from None
            except PermissionError:  # alive, another user's: not ours, but not gone either
                pass
        time.sleep(poll_s)


def ask(jobdir: Path, request: str, grant: str) -> None:
    """Touch ``request`` in ``jobdir`` and wait for the parent's ``grant`` file (``run_gated`` on its side)."""
    (jobdir / request).touch()
    until = time.monotonic() + GATE_WAIT_S
    while not (jobdir / grant).exists():
        if time.monotonic() > until:
            raise SystemExit("kernellab: the GPU was not handed over in time")
        time.sleep(0.01)


if __name__ == "__main__":
    main()
