"""The compilers a GPU process runs on the host, wrapped so that its hold of the GPU is given up while they
work: a sandbox worker (:meth:`~kernellab.sandbox._worker.Worker.off_gpu`) and a gated process (an ncu target, the
Inductor seed: :class:`~kernellab.sandbox._profile_target.GpuHold`) both use them. Standard library only at import:
each function imports the compiler it wraps."""

from __future__ import annotations

from typing import Any


def release_for_compiles(off: Any, on: Any) -> list[str]:
    """Wrap the compilers a candidate's first call (or an Inductor module's load) runs on the host --
    Triton's ``compile`` (``JITFunction`` binds ``triton.compiler.compile`` when it first runs; Inductor
    calls ``triton.compile``) and CuPy's NVRTC compile -- in ``off`` (:meth:`Worker.off_gpu`, or a gated
    process's :meth:`GpuHold.off_for`), and what Inductor benchmarks meanwhile in ``on``: seconds of CPU work
    during which a timing waiting for the GPU went on waiting (py-spy on a 4-job bench: one slot running,
    three waiting for the lock). Returns the names wrapped. Inductor compiles in this process (one
    compile thread, set in the worker's environment), so its compiles are seen here too."""
    done = release_for_triton(off) + release_for_inductor(off, on)
    try:
        import importlib.util

        if importlib.util.find_spec("cupy") is not None:
            from cupy.cuda import compiler as cc

            for name in ("compile_using_nvrtc", "_compile_module_with_cache"):
                f = getattr(cc, name, None)
                if callable(f) and not getattr(f, "_kernellab_off_gpu", False):
                    setattr(cc, name, off(f))
                    done.append(f"cupy.cuda.compiler.{name}")
    except Exception:  # pragma: no cover - a broken CuPy install: its compiles keep the hold
        pass
    return done


def release_for_triton(off: Any) -> list[str]:
    """Triton's ``compile`` wrapped in ``off`` wherever it is looked up; returns the names wrapped."""
    done: list[str] = []
    try:
        import triton
        import triton.compiler as tc
        import triton.compiler.compiler as tcc
    except Exception:  # pragma: no cover - no triton
        return done
    orig = tcc.compile
    if getattr(orig, "_kernellab_off_gpu", False):
        return done
    wrapped = off(orig)
    for mod in (tcc, tc, triton):
        if getattr(mod, "compile", None) is orig:
            mod.compile = wrapped
            done.append(f"{mod.__name__}.compile")
    return done


def release_for_inductor(off: Any, on: Any) -> list[str]:
    """Inductor's graph compile (``compile_fx``, which ``torch.compile``'s default backend looks up when it
    compiles: the baseline's and a re-timing's torch.compile of the reference, a candidate's own) wrapped in
    ``off`` -- Dynamo's trace is done by then, the lowering and code generation are host work (5-15 s at
    KernelBench's sizes on the H200, a read that every waiting timing waited out) -- and what it runs on the
    GPU meanwhile in ``on``: its benchmarks, and pad_mm's padded-or-not choice, which makes its inputs on the
    device before it benchmarks. Returns the names wrapped."""
    done: list[str] = []
    try:
        import torch._inductor.compile_fx as cfx
        from torch._inductor.runtime import benchmarking
    except Exception:  # pragma: no cover - no Inductor: nothing of it to wrap
        return done
    if not getattr(cfx.compile_fx, "_kernellab_off_gpu", False):
        cfx.compile_fx = off(cfx.compile_fx)
        done.append("torch._inductor.compile_fx.compile_fx")
    bm = benchmarking.benchmarker
    bm.benchmark_gpu = on(bm.benchmark_gpu)
    done.append("torch._inductor benchmarker.benchmark_gpu")
    try:
        from torch._inductor.fx_passes import pad_mm
    except ImportError:  # pragma: no cover
        return done
    for name in ("_should_pad", "should_pad_bench"):
        if callable(getattr(pad_mm, name, None)):
            setattr(pad_mm, name, on(getattr(pad_mm, name)))
            done.append(f"pad_mm.{name}")
    return done
