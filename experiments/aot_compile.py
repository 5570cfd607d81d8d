"""Compile a candidate's Triton kernels for the H200 (sm_90) on a machine without a GPU, with the arguments its
launchers pass at the problem's own size: what the interpreter never checks (a loop-carried value whose type
changes, PTX inline assembly, a constexpr branch only the GPU takes) fails here, before device time is spent.

The candidate runs on the meta device, each kernel launch caught instead of run: its arguments give the signature,
specialised as Triton's launcher does it (an integer 1 a constant, divisibility by 16 an attribute), and
``triton.compile`` builds it down to a cubin with the ptxas that Triton bundles. Constexprs the launcher reads off
the device (``RNA_ASM=x.is_cuda``) are set as on a GPU; a conv seed that follows cuDNN is compiled with its own
conv (``LIBRARY`` reads False on the meta device). A launcher that needs values (not shapes) of its inputs cannot run
on the meta device: that problem is reported.

    PYTHONPATH=. python experiments/aot_compile.py PROBLEM.py [...] [--children] [--config KEY=VALUE ...]

``--children``: the seed and every one-action child the builtin planner proposes; ``--config``: set on every conv
group (e.g. ``TAP_MAJOR=0``). Prints one line per kernel (compile seconds, or the first line of the error), with the
registers a thread uses and the bytes it spills to local memory as ptxas reports them (``ptxas -v``: a spill is a
round trip to L1/L2 inside the K loop, which no interpreter test shows); exit 1 when one failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# constexprs a launcher derives from the tensors' device: on the meta device they read False, on the GPU True
ON_GPU = {"RNA_ASM": True}
_ids = itertools.count()
REPORTED = ("TAP_MAJOR", "TF32RN", "RNA_ASM", "LIBRARY", "BLOCK_M", "BLOCK_N", "BLOCK_K")


class AotError(Exception):
    """Bad input: printed as one line, exit 2."""


def _load(source: str, tmp: Path):
    name = f"kl_aot_{next(_ids)}"
    f = tmp / f"{name}.py"
    f.write_text(source)  # Triton reads a kernel's source from its file
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def signature(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict, dict]:
    """(signature, constexprs, attributes, options) of one launch of the JITFunction ``fn``, specialised as Triton's
    launcher specialises it (an integer 1 becomes a constant, pointers and integers divisible by 16 say so)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    kw = dict(kwargs)
    options = {k: kw.pop(k) for k in ("num_warps", "num_stages") if k in kw}
    values = dict(zip(fn.arg_names, args, strict=False)) | kw
    sig, consts, attrs = {}, {}, {}
    for i, (p, name) in enumerate(zip(fn.params, fn.arg_names, strict=True)):
        if name not in values:
            if not p.has_default:
                raise AotError(f"{fn.__name__}: argument {name} not passed")
            values[name] = p.default
        v = values[name]
        if p.is_constexpr:
            sig[name], consts[name] = "constexpr", ON_GPU.get(name, v)
            continue
        kind, desc = native_specialize_impl(BaseBackend, v, p.is_const, not p.do_not_specialize,
                                            not p.do_not_specialize_on_alignment)
        sig[name] = kind
        if kind == "constexpr":
            consts[name] = desc
        elif isinstance(desc, str) and BaseBackend.parse_attr(desc):
            attrs[(i,)] = BaseBackend.parse_attr(desc)
    return sig, consts, attrs, options


def launches(problem, source: str, tmp: Path) -> list[tuple[object, tuple, dict]]:
    """Every kernel launch of one forward of ``source``'s ModelNew at the problem's size, on the meta device."""
    import triton

    from kernellab.problem import instantiate

    mod = _load(source, tmp)
    caught: list[tuple[object, tuple, dict]] = []
    jit = triton.runtime.jit.JITFunction
    if jit is None or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise AotError("the interpreter is on (TRITON_INTERPRET): kernels are not compiled under it")

    def run(self, *args, grid, warmup, **kwargs):  # a launch caught: the kernels it calls stay as they are
        caught.append((self, args, kwargs))

    real, jit.run = jit.run, run
    try:
        inst = instantiate(problem, small=False, seed=0, device="meta", model_cls=mod.ModelNew)
        with torch.no_grad():
            inst.model(*inst.inputs)
    finally:
        jit.run = real
    return caught


def ptxas_usage(ptx: str, arch: int = 90) -> dict:
    """``{"regs", "spill_stores", "spill_loads"}`` of the one kernel in ``ptx``, from Triton's bundled ptxas run
    verbose on it (Triton runs the same ptxas, and drops its log)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        log = subprocess.run([get_ptxas(arch).path, "-v", f"--gpu-name={sm_arch_from_capability(arch)}", str(src),
                              "-o", str(Path(tmp) / "k.o")], capture_output=True, text=True, check=True).stderr
    num = {k: re.search(p, log) for k, p in (("regs", r"Used (\d+) registers"), ("spill_stores", r"(\d+) bytes spill stores"),
                                              ("spill_loads", r"(\d+) bytes spill loads"))}
    return {k: int(m.group(1)) if m else None for k, m in num.items()}


def compile_all(problem, source: str, arch: int = 90) -> list[dict]:
    """``[{"kernel", "seconds" | "error"}]``: each distinct launch of ``source``'s kernels compiled for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    out, seen = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        for fn, args, kwargs in launches(problem, source, Path(tmp)):
            sig, consts, attrs, options = signature(fn, args, kwargs)
            key = (fn.__name__, tuple(sorted(sig.items())), tuple(sorted(consts.items())), tuple(sorted(attrs)),
                   tuple(sorted(options.items())))
            if key in seen:
                continue
            seen.add(key)
            t0 = time.perf_counter()
            try:
                k = triton.compile(ASTSource(fn, sig, consts, attrs), target=target, options=options)
                ptx = k.asm.get("ptx", "")
                out.append({"kernel": fn.__name__, "seconds": round(time.perf_counter() - t0, 2),
                            "wgmma": "wgmma" in ptx, "mma_sync": "mma.sync" in ptx, "cvt_rna": "cvt.rna.tf32.f32" in ptx,
                            "constexprs": {n: v for n, v in consts.items() if n in REPORTED}} | ptxas_usage(ptx, arch))
            except Exception as exc:  # noqa: BLE001 - the compile error is the result
                first = (str(exc).strip().splitlines() or [type(exc).__name__])
                out.append({"kernel": fn.__name__, "error": f"{type(exc).__name__}: {' | '.join(first[-3:])}"[:400]})
    return out


def _sources(problem, children: bool, config: dict) -> list[tuple[str, str]]:
    from kernellab.agents.builtin import SetConfig, build, built, candidate_actions

    b = built(problem)
    sets = [SetConfig(g.id, tuple(config.items()), "aot") for g in b.groups if g.kind == "conv"] if config else []
    out = [("seed", build(problem, sets).source)]
    if children:
        for action, _why in candidate_actions(problem, b):
            out.append((action.describe(), build(problem, [action, *sets]).source))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problems", nargs="+", type=Path, help="problem files")
    ap.add_argument("--children", action="store_true", help="the planner's one-action children too")
    ap.add_argument("--config", action="append", default=[], metavar="KEY=VALUE", help="set on every conv group")
    ap.add_argument("--arch", type=int, default=90, help="the CUDA compute capability (default 90: H100/H200)")
    args = ap.parse_args(argv)
    from kernellab.problem import load_problem

    failed = 0
    try:
        config = {}
        for kv in args.config:
            k, sep, v = kv.partition("=")
            if not sep or not k.isidentifier():
                raise AotError(f"--config takes KEY=VALUE, got {kv!r}")
            config[k] = int(v) if v.lstrip("-").isdigit() else v
        for path in args.problems:
            if not path.is_file():
                raise AotError(f"no problem file {path}")
            problem = load_problem(path, validate_run=False)
            for what, source in _sources(problem, args.children, config):
                try:
                    rows = compile_all(problem, source, args.arch)
                except Exception as exc:  # noqa: BLE001 - a launcher that cannot run on the meta device
                    print(f"{problem.name} [{what}]: not run on the meta device: {type(exc).__name__}: {exc}"[:300])
                    continue
                for r in rows:
                    failed += "error" in r
                    if "error" in r:
                        print(f"{problem.name} [{what}] {r['kernel']}: {r['error']}", flush=True)
                        continue
                    notes = [k for k in ("wgmma", "mma_sync", "cvt_rna") if r[k]] + [f"{k}={v}" for k, v in r["constexprs"].items()]
                    notes += [f"regs={r['regs']}"] + ([f"spills={r['spill_stores']}/{r['spill_loads']}B"] if r["spill_stores"] else [])
                    print(f"{problem.name} [{what}] {r['kernel']}: {r['seconds']} s {' '.join(notes)}", flush=True)
    except AotError as exc:
        print(f"aot_compile: {exc}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
