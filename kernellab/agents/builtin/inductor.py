"""The Inductor seed: torch.compile's own generated code for a problem, wrapped as a candidate.

``inductor_seed(problem, device, small)`` runs torch.compile (default mode, static shapes, one graph)
on the problem's ``Model`` at the inputs the sandbox will judge it at, takes Inductor's output module
(``torch._inductor.utils.run_and_get_code``) and writes one self-contained candidate file: the
problem's source, that module's source (executed as a module of its own, so its names never meet the
problem's), and ``class ModelNew(Model)`` whose ``forward`` hands Inductor's ``call(args)`` the
module's parameters, buffers and inputs in the order of the graph's placeholders. That order is
read, never guessed: each tensor the backend receives for a placeholder is matched by identity with
the model's parameters, buffers and forward inputs, and AOTAutograd must hand Inductor the same list
(its graph's placeholders are checked one to one). Its Triton kernels are the candidate's own
kernels; its extern calls (cuBLAS / cuDNN through ``extern_kernels`` and aten) are library.

The work runs in a child process (``python -c ...main()``): compiling needs the model and inputs on
the device at full size, Dynamo and Inductor keep process-wide state, and a compile may take a
minute; the orchestrator only gets the source back, or :class:`InductorSeedError` with the reason.

Layout: compiled with ``layout_optimization`` off, so that Inductor's cuDNN convs see eager's layout
(channels-last convs run another TF32 algorithm, off the TF32 reference by ~1e-3 at fp32); a compile
whose outputs still differ from eager beyond the tolerances is refused, with the difference as reason.

Mode: the model is compiled in its own mode (``apply_mode``). A training-mode BatchNorm's running
statistics are inputs that the graph mutates; Inductor (AOTAutograd keeps inference input mutations
in the graph) writes them back in place inside ``call``, so the candidate updates the module's own
buffers as the reference does. A graph whose mutations or aliased outputs AOTAutograd would replay
outside ``call`` is not wrapped (the reason says which).

CPU: Inductor writes C++ for the CPU by default. With ``cpu_backend = "triton"`` it writes Triton,
and Inductor's runtime launches those kernels through the interpreter when ``TRITON_INTERPRET=1``
(``CachingAutotuner.run``), so CI runs the same path. Two things differ from the GPU: code generation
asks Triton's active driver for a backend hash, which the interpreter has none of (the child answers
a fixed hash: it only keys Inductor's caches), and the interpreter has no ``libdevice``, so calls of
``libdevice.f`` that ``tl.math`` also has are written as ``tl_math.f`` (the candidate's docstring
lists them); a kernel needing another libdevice function fails in the interpreter.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kernellab.problem import Problem
from kernellab.vocab import small_for

from ..roles import Code, Proposal

__all__ = ["inductor_seed", "inductor_proposal", "InductorSeedError", "ACTION", "generate", "wrap"]

ACTION = "inductor_seed"  # the planner's proposal kind for this seed
TIMEOUT_S = 900.0
REQUEST = "request.json"  # the problem, in the child's working directory


class InductorSeedError(RuntimeError):
    """No Inductor seed for this problem; the message says why (one line)."""


def inductor_seed(problem: Problem, device: str, small: bool | None = None, timeout: float = TIMEOUT_S,
                  gate: Any = None) -> Code:
    """The candidate made from torch.compile's code for ``problem`` on ``device`` (``small``: None =
    SMALL on the CPU, full sizes on CUDA, as the sandbox judges). Raises :class:`InductorSeedError`.

    ``gate``: the executor's ``profiling`` (``gate(problem, small=...)`` yields a ProfileGate). The child runs
    the reference, torch.compile's kernels (and its autotuning) and the wrapped candidate at full size: with
    a gate it is admitted for the problem's footprint and shares the GPU as a job's correctness work does,
    from building the problem to its end, so none of it runs while a timing or a profile has the GPU alone
    (without one it ran beside other campaigns' timings). Its imports hold nothing."""
    if device not in ("cpu", "cuda"):
        raise InductorSeedError(f"device {device!r} is not cpu or cuda")
    small = small_for(device, small)
    payload = json.dumps({"name": problem.name, "source": problem.source, "path": problem.path,
                          "device": device, "small": small})
    env = dict(os.environ)
    # Inductor compiles this graph's few kernels in the process: its default pool of compile workers (one per
    # core, each importing torch) took longer to start than the compile itself, and a bench starts one per campaign
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    from kernellab.sandbox import run_gated

    cmd = [sys.executable, "-c", "from kernellab.agents.builtin.inductor import main; main()"]
    # where the seed's time went (``meta.inductor.seconds``): the admission, then run_gated's marks (``start``: the
    # child's imports, ``shared``/``off``: with and without the GPU's share, ``report``: after the GPU work)
    seconds: dict[str, float] = {}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kernellab-inductor-") as tmp:
        Path(tmp, REQUEST).write_text(payload)
        try:
            with gate(problem, small=small) if gate is not None else contextlib.nullcontext() as g:
                held = g if g is not None and g.gpu is not None else None  # no GPU visible: nothing to share
                seconds["admission"] = round(time.monotonic() - t0, 3)
                if held is not None:
                    env["CUDA_VISIBLE_DEVICES"] = held.gpu
                proc = run_gated(cmd, Path(tmp), env, timeout, held)
                seconds.update(getattr(held, "seconds", None) or {})
        except subprocess.TimeoutExpired:
            raise InductorSeedError(f"torch.compile of {problem.name} took over {timeout:.0f} s") from None
    answer = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            try:
                answer = json.loads(line)
                break
            except ValueError:
                continue
    if answer is None:
        tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-1:] or ["no output"]
        raise InductorSeedError(f"the Inductor seed process exited with {proc.returncode}: {tail[0][:300]}")
    if not answer.get("ok"):
        raise InductorSeedError(answer.get("reason") or "unknown reason")
    meta = answer["meta"]
    meta["seconds"] = {**seconds, "total": round(time.monotonic() - t0, 3)}
    n = len(meta.get("triton_kernels") or [])
    return Code(source=answer["source"], action=f"seed: torch.compile (Inductor) code, {n} Triton kernel(s)",
                language="triton", origin="inductor", model="inductor", meta={"inductor": meta})


def inductor_proposal() -> Proposal:
    """The planner's seed proposal for this candidate (coded by ``BuiltinAgents.code``)."""
    return Proposal(None, "seed: torch.compile's own code (Inductor)",
                    "start no worse than torch.compile: its kernels as a candidate", action={"kind": ACTION})


def main() -> None:
    """Child process: the JSON problem in ``REQUEST`` (its working directory), one JSON line on stdout (``ok``
    and source, or reason)."""
    from kernellab._runtime import setup

    setup()  # what every kernellab process sets before its work (the interpreter switch, the ast lock)
    req = json.loads(Path(REQUEST).read_text())
    problem = Problem(name=req["name"], source=req["source"], path=req.get("path"))
    try:
        source, meta = generate(problem, req["device"], bool(req["small"]))
        out = {"ok": True, "source": source, "meta": meta}
    except InductorSeedError as exc:
        out = {"ok": False, "reason": str(exc)}
    except Exception as exc:  # torch.compile itself failed: that is the reason
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())
        out = {"ok": False, "reason": f"torch.compile failed: {msg[:500]}"}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()


# -- in the child process ----------------------------------------------------------------------

def _cpu_triton() -> None:
    """Inductor's Triton backend on the CPU, for the interpreter (see the module docstring)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise InductorSeedError("on the CPU the Inductor seed needs TRITON_INTERPRET=1 (its Triton kernels run "
                                "only in the interpreter)")
    import torch._inductor.config as ic
    import torch.utils._triton as ut

    if not hasattr(ic, "cpu_backend"):
        raise InductorSeedError("this torch has no torch._inductor.config.cpu_backend: no Triton code for the CPU")
    ic.cpu_backend = "triton"
    # the interpreter has no driver to hash; the hash only keys Inductor's caches
    ut.triton_hash_with_backend = lambda: "KERNELLAB-TRITON-INTERPRETER"
    # this process runs the kernels once (torch.compile's own call): the interpreter's math is tl.math's, as in
    # the written candidate (``_interp_libdevice``)
    import triton.language as tl
    from torch._inductor.runtime import triton_helpers

    real = triton_helpers.libdevice

    class _Libdevice:
        def __getattr__(self, name: str) -> Any:
            return getattr(tl.math, name) if hasattr(tl.math, name) else getattr(real, name)

    triton_helpers.libdevice = _Libdevice()


def generate(problem: Problem, device: str, small: bool) -> tuple[str, dict]:
    """Compile, check and wrap (in this process). Raises InductorSeedError with the reason."""
    import torch

    from kernellab.problem import instantiate, output_tensors

    if device == "cuda" and not torch.cuda.is_available():
        raise InductorSeedError("no CUDA device visible")
    if device == "cpu":
        _cpu_triton()
    import torch._inductor.compile_fx as cfx
    import torch._inductor.config as ic
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.utils import run_and_get_code

    from kernellab.sandbox._profile_target import gated_share

    gated_share(Path.cwd(), device)  # the GPU from here on, shared (inductor_seed's gate), compiles apart
    inst = instantiate(problem, small=small, seed=0, device=device)
    model, inputs = inst.model, inst.inputs
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    names: dict[int, tuple[str, Any]] = {}
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor):
            names.setdefault(id(x), ("input", i))
    for fqn, p in model.named_parameters():
        names.setdefault(id(p), ("param", fqn))
    for fqn, b in model.named_buffers():
        names.setdefault(id(b), ("buffer", fqn))

    rec: dict[str, Any] = {"graphs": 0}

    def backend(gm: Any, example_inputs: list) -> Any:
        rec["graphs"] += 1
        rec["placeholders"] = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
        rec["dynamo_inputs"] = list(example_inputs)

        def inner(gm2: Any, ex2: list, **kw: Any) -> Any:
            ctx = torch._guards.TracingContext.try_get()
            rec["fw_metadata"] = getattr(ctx, "fw_metadata", None)
            rec["aot_placeholders"] = [n.name for n in gm2.graph.nodes if n.op == "placeholder"]
            rec["aot_inputs"] = list(ex2)
            out_node = next(n for n in gm2.graph.nodes if n.op == "output")
            rec["aot_outputs"] = len(out_node.args[0]) if isinstance(out_node.args[0], (list, tuple)) else 1
            return compile_fx_inner(gm2, ex2, **kw)

        return cfx.compile_fx(gm, example_inputs, inner_compile=inner)  # looked up now: gated, it gives the share up

    torch.manual_seed(1234)
    # layout_optimization off: by default Inductor turns the convs of a graph channels-last, so cuDNN picks
    # another TF32 algorithm than eager's NCHW call, and an fp32 conv then differs from the (TF32) eager
    # reference by ~1e-3 (seen on the H200). With the layout left as eager's, cuDNN gets eager's call.
    with torch.no_grad(), ic.patch(fx_graph_cache=False, fx_graph_remote_cache=False, layout_optimization=False):
        compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
        out, codes = run_and_get_code(compiled, *inputs)
    if rec["graphs"] != 1 or len(codes) != 1:
        raise InductorSeedError(f"torch.compile made {rec['graphs']} graph(s) and {len(codes)} output module(s); "
                                "one of each can be wrapped")
    args = []
    for ph, t in zip(rec["placeholders"], rec["dynamo_inputs"], strict=True):
        if not isinstance(t, torch.Tensor):
            raise InductorSeedError(f"graph input {ph} is a {type(t).__name__}, not a tensor (dynamic sizes?)")
        if id(t) not in names:
            raise InductorSeedError(f"graph input {ph} is neither a parameter, a buffer nor an input of Model")
        args.append(names[id(t)])
    aot = rec.get("aot_inputs")
    if aot is None or len(aot) != len(args) or any(
            a is not d and (not isinstance(a, torch.Tensor) or a.shape != d.shape or a.dtype != d.dtype)
            for a, d in zip(aot, rec["dynamo_inputs"], strict=True)):
        raise InductorSeedError("AOTAutograd handed Inductor another argument list than the graph's placeholders "
                                f"({len(aot or [])} vs {len(args)}): not wrapped")
    md = rec.get("fw_metadata")
    if md is None:
        raise InductorSeedError("no AOTAutograd metadata for the graph: its outputs cannot be read")
    kinds = sorted({o.output_type.name for o in md.output_info if o.output_type.name != "non_alias"})
    if kinds:
        raise InductorSeedError(f"the graph returns aliases ({', '.join(kinds)}) that AOTAutograd rebuilds outside "
                                "call(): not wrapped")
    if md.num_mutated_inp_runtime_indices or md.num_intermediate_bases or getattr(md, "tokens", None):
        raise InductorSeedError("AOTAutograd applies input mutations or effect tokens outside call(): not wrapped")
    outs = output_tensors(out)
    if len(outs) != len(md.output_info) or rec["aot_outputs"] != len(outs):
        raise InductorSeedError(f"Model returns {len(outs)} tensor(s) but the graph {len(md.output_info)}: "
                                "an output is an input or a constant, not wrapped")
    container = "tensor" if isinstance(out, torch.Tensor) else type(out).__name__
    if container not in ("tensor", "tuple", "list"):
        raise InductorSeedError(f"Model returns a {container}: only a tensor, a tuple or a list is wrapped")
    source, meta = wrap(problem, codes[0], args, container, n_out=len(outs), n_inputs=len(inputs), device=device,
                        small=small,
                        torch_version=torch.__version__, mode=getattr(inst.module, "MODE", "train"))
    _self_check(problem, source, inst, saved, out, small, device)
    return source, meta


def _self_check(problem: Problem, source: str, inst: Any, saved: dict, compiled_out: Any, small: bool,
                device: str) -> None:
    """The wrapped file gives torch.compile's outputs on the compile's inputs, and those match eager at the
    problem's tolerances: a wiring mistake, or an Inductor that draws other random numbers than eager
    (dropout), is a reason here instead of a wasted candidate."""
    import types

    import torch

    from kernellab.problem import apply_mode, output_tensors

    settings = problem.settings()
    atol, rtol = settings["atol"], settings["rtol"]
    with tempfile.TemporaryDirectory(prefix="kernellab-inductor-check-") as tmp:
        path = os.path.join(tmp, "kernellab_inductor_check.py")
        with open(path, "w", encoding="utf-8") as f:
            f.write(source)
        mod = types.ModuleType("kernellab_inductor_check")
        mod.__file__ = path
        exec(compile(source, path, "exec"), mod.__dict__)
        torch.manual_seed(0)
        new = apply_mode(mod.ModelNew(*inst.init_inputs).to(device=device, dtype=inst.dtype), getattr(mod, "MODE", "train"))
        ref = apply_mode(inst.module.Model(*inst.init_inputs).to(device=device, dtype=inst.dtype), getattr(mod, "MODE", "train"))
        for m in (new, ref):
            m.load_state_dict({k: v.clone() for k, v in saved.items()})
        with torch.no_grad():
            torch.manual_seed(1234)
            mine = output_tensors(new(*inst.inputs))
            torch.manual_seed(1234)
            eager = output_tensors(ref(*inst.inputs))
    for k, (a, b, e) in enumerate(zip(mine, output_tensors(compiled_out), eager, strict=True)):
        if a.shape != b.shape or not torch.allclose(a.float(), b.float(), atol=atol, rtol=rtol, equal_nan=True):
            raise InductorSeedError(f"the wrapped module's output {k} differs from torch.compile's "
                                    f"(max abs {_maxdiff(a, b)}): the wiring is wrong, not wrapped")
        if not torch.allclose(b.float(), e.float(), atol=atol, rtol=rtol, equal_nan=True):
            raise InductorSeedError(f"torch.compile's output {k} differs from eager by {_maxdiff(b, e)} (atol {atol}, "
                                    f"rtol {rtol}; random numbers drawn differently, or numerics): it would be judged "
                                    "incorrect")


def _maxdiff(a: Any, b: Any) -> str:
    try:
        return f"{(a.double() - b.double()).abs().max().item():.3g}"
    except Exception:
        return "?"


def _expr(kind: str, ref: Any) -> str:
    if kind == "input":
        return f"_aligned(inputs[{ref}])"
    *mods, leaf = str(ref).split(".")
    base = "self"
    for m in mods:
        base = f"{base}.{m}" if m.isidentifier() else f"getattr({base}, {m!r})"
    return f"{base}.{leaf}" if leaf.isidentifier() else f"getattr({base}, {leaf!r})"


_KERNEL = re.compile(r"^(\w+) = async_compile\.triton\('(\w+)'", re.M)
_EXTERN = re.compile(r"\b(?:extern_kernels|aten|torch\.ops\.aten)\.(\w+)")


def _interp_libdevice(code: str) -> tuple[str, list[str]]:
    """``libdevice.f(`` -> ``tl_math.f(`` for the functions ``tl.math`` has (the interpreter's only math)."""
    import triton.language as tl

    done: set[str] = set()

    def sub(m: re.Match) -> str:
        if hasattr(tl.math, m.group(1)):
            done.add(m.group(1))
            return f"tl_math.{m.group(1)}("
        return m.group(0)

    return re.sub(r"\blibdevice\.(\w+)\(", sub, code), sorted(done)


def wrap(problem: Problem, code: str, args: list[tuple[str, Any]], container: str, n_out: int, n_inputs: int,
         device: str, small: bool, torch_version: str, mode: str) -> tuple[str, dict]:
    """The candidate file around Inductor's output module ``code``; ``args`` are (kind, name-or-index)
    in the order of ``call``'s arguments."""
    mapped: list[str] = []
    if device == "cpu":
        code, mapped = _interp_libdevice(code)
    kernels = [m.group(1) for m in _KERNEL.finditer(code)]
    live = "\n".join(ln for ln in code.splitlines() if not ln.lstrip().startswith("#"))
    externs = sorted({m.group(1) for m in _EXTERN.finditer(live)} - {"default", "Tensor"})
    fut, psrc = [], []
    for line in problem.source.splitlines():
        (fut if re.match(r"\s*from __future__ import", line) else psrc).append(line)
    order = ", ".join(f"{k} {r}" for k, r in args)
    doc = (f'"""kernellab inductor candidate for {problem.name}: torch.compile\'s own generated code, wrapped.\n\n'
           f"torch {torch_version}, default mode, static shapes, one graph, on {device} at the "
           f"{'SMALL' if small else 'full'} size, {mode} mode; the output module of\n"
           "torch._inductor.utils.run_and_get_code, run as a module of its own below. Its Triton kernels are this\n"
           "candidate's own kernels; its extern calls are library. call() asserts the compiled sizes and strides.\n"
           f"Triton kernels: {', '.join(kernels) or 'none'}\n"
           f"Extern calls: {', '.join(externs) or 'none'}\n"
           f"call(args) order (the graph's placeholders): {order}\n"
           + (f"Interpreter: libdevice.{{{', '.join(mapped)}}} written as tl_math (no libdevice there)\n" if mapped else "")
           + '"""\n')
    if '"""' in code or code.endswith("\\"):
        literal_head, literal = "_INDUCTOR_SOURCE = (", repr(code) + ")\n"
    else:
        literal_head, literal = '_INDUCTOR_SOURCE = r"""', code + '"""\n'
    parts = [doc]
    if fut:
        parts.append("\n".join(fut) + "\n")
    parts.append("# ---- the problem (Model and its constants), copied verbatim ----\n" + "\n".join(psrc).strip("\n") + "\n")
    parts.append("# ---- torch.compile's output module, executed as a module of its own ----\n"
                 "import os  # noqa: E402\nimport types  # noqa: E402\n\nimport torch  # noqa: E402\n\n"
                 "# Inductor compiles the kernels in this process, not in a pool of workers\n"
                 'os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")\n')
    head = "\n\n".join(parts) + "\n\n"
    opener_line = head.count("\n") + 1  # the line of `_INDUCTOR_SOURCE = ...`
    body = (f"{literal_head}{literal}\n\n"
            "def _load_inductor():\n"
            "    # tracebacks point at this file's lines: the source is compiled at the line it sits on\n"
            '    path = globals().get("__file__") or "<kernellab-inductor>"\n'
            '    mod = types.ModuleType(__name__ + "_inductor")\n'
            "    mod.__file__ = path\n"
            f'    exec(compile("\\n" * {opener_line - 1} + _INDUCTOR_SOURCE, path, "exec"), mod.__dict__)\n'
            "    return mod\n\n\n"
            "_inductor = _load_inductor()\n\n\n"
            "def _aligned(x):\n"
            "    # Inductor's kernels assume 16-byte aligned inputs (its own wrapper copies misaligned ones)\n"
            "    if isinstance(x, torch.Tensor) and x.data_ptr() % 16:\n"
            "        return x.clone()\n"
            "    return x\n\n\n"
            "class ModelNew(Model):\n"
            '    """Model whose forward is Inductor\'s call() on its own parameters and buffers (same weights)."""\n\n'
            "    def forward(self, *inputs):\n"
            f"        if len(inputs) != {n_inputs}:\n"
            f'            raise TypeError(f"expected {n_inputs} input(s), got {{len(inputs)}}")\n'
            "        args = [\n" + "".join(f"            {_expr(k, r)},\n" for k, r in args) + "        ]\n"
            "        outs = _inductor.call(args)\n"
            + ("        return outs[0]\n" if container == "tensor" else f"        return {container}(outs[:{n_out}])\n"))
    source = head + body
    meta = {"torch": torch_version, "device": device, "small": small, "mode": mode,
            "triton_kernels": kernels, "extern": externs, "args": [f"{k}:{r}" for k, r in args],
            "libdevice_as_tl_math": mapped}
    return source, meta
