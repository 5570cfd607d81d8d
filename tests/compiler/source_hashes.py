"""The sha256 of every source the builtin generates for the KernelBench level1/level2 problems it handles: the seeds
(``seed``) and each one-action child the rule-based planner proposes (``candidate_actions``), built through the public
entry points at the problems' own (symbolic) sizes. ``test_sources_unchanged.py`` compares them with the committed
``sources_sha256.json``, so a refactor of the compiler (issue 33: the move to ``kernellab/compiler/``, lowering as a
registry, the kernel families as templates) is shown byte for byte not to change what it generates.

Regenerate (only when a change of the generated code is meant, and say why in the commit):
``TRITON_INTERPRET=1 PYTHONPATH=. python tests/compiler/source_hashes.py --write``"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

# ../shared/kernelbench beside the checkout, or KERNELBENCH_DIR
KB = Path(os.environ.get("KERNELBENCH_DIR") or Path(__file__).resolve().parents[2].parent / "shared" / "kernelbench")
FIXTURE = Path(__file__).with_name("sources_sha256.json")


def problem_files(kb: Path = KB) -> list[Path]:
    return sorted((kb / "level1").glob("*.py")) + sorted((kb / "level2").glob("*.py"))


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _fault(exc: BaseException) -> str:
    return f"error: {type(exc).__name__}"


def hashes_of(path: str) -> dict[str, str]:
    """``{"seed<i>" | action json: sha256 | "error: <class>"}`` of one problem file."""
    from kernellab.agents.builtin import build, built, candidate_actions, seed
    from kernellab.problem import load_problem

    out: dict[str, str] = {}
    try:
        problem = load_problem(Path(path), validate_run=False)
        codes = seed(problem)
    except Exception as exc:  # noqa: BLE001 - a problem the builtin cannot build is recorded as such
        return {"seed": _fault(exc)}
    for i, code in enumerate(codes):
        out[f"seed{i}"] = _sha(code.source)
    try:
        actions = candidate_actions(problem, built(problem))
    except Exception as exc:  # noqa: BLE001
        out["actions"] = _fault(exc)
        return out
    for action, _why in actions:
        key = json.dumps(action.to_dict(), sort_keys=True)
        try:
            out[key] = _sha(build(problem, [action]).source)
        except Exception as exc:  # noqa: BLE001
            out[key] = _fault(exc)
    return out


def _gemm_specs() -> list:
    """A grid over GemmSpec: every layout, dtype, row reduction, split-K, persistence and operand kind."""
    import itertools

    from kernellab.compiler.kernels import gemm as G

    ops = (G.Operand("bias", "row"), G.Operand("c", "col"), G.Operand("res", "matrix"), G.Operand("alpha", "scalar"))
    epi = "acc = acc + bias\nacc = acc * alpha + res + c"
    out = []
    for batched, trans_b, dtype, red, split, pers, prec, with_ops in itertools.product(
            (False, True), (False, True), G.DTYPES, G.ROW_REDUCTIONS, (1, 4), (False, True),
            (None, "tf32", "tf32x3"), (False, True)):
        if split > 1 and red is not None or prec and dtype != "float32":
            continue
        operands: tuple = ops if with_ops else ()
        repi = ""
        if red == "layernorm" and with_ops:
            operands = (*ops, G.Operand("ln_weight", "row"), G.Operand("ln_bias", "row"))
        if red is not None and with_ops:
            repi = "acc = acc * alpha + c" if red in G.VECTOR_REDUCTIONS else "acc = acc * alpha + bias"
        out.append(G.GemmSpec(name="k", batched=batched, trans_b=trans_b, dtype=dtype, allow_tf32=prec == "tf32",
                              operands=operands, epilogue=epi if with_ops else "", row_reduction=red,
                              row_epilogue=repi, split_k=split, persistent=pers, fp32_precision=prec))
    return out


def _conv_specs() -> list:
    """A grid over ConvSpec: ranks, strides, groups, transposed, dtypes, precisions, reductions, TF32 modes."""
    import itertools

    from kernellab.compiler.kernels import conv as C

    ops = (C.ConvOperand("bias", "tensor"), C.ConvOperand("s", "scalar"))
    out = []
    for dims, strided, groups, transposed, dtype, prec, (red, axis, keep), whole, tf32ref, with_ops in itertools.product(
            (1, 2, 3), (False, True), (1, 2, 0), (False, True), C._DTYPES, C._PRECISIONS,
            ((None, "spatial", False), ("sum", "spatial", False), ("mean", "spatial", True), ("amax", "channel", False),
             ("amin", "channel", True), ("first", "channel", False)),
            (False, True), C.TF32_REFERENCE_MODES, (False, True)):
        if transposed and groups == 0 or prec != "ieee" and dtype != "float32" or tf32ref and dtype != "float32":
            continue
        if (red and axis == "channel" or whole) and groups != 1 or whole and red and axis == "channel" and red != "first":
            continue
        n = dims
        out.append(C.ConvSpec(name="c", dims=dims, stride=(2,) * n if strided else (1,) * n,
                              padding=(1,) * n, dilation=(2,) * n if strided and not transposed else (1,) * n,
                              output_padding=(1,) * n if strided and transposed else (0,) * n, groups=groups,
                              transposed=transposed, dtype=dtype, fp32_precision=prec,
                              operands=ops if with_ops else (), epilogue="acc = acc + bias\nacc = acc * s" if with_ops else "",
                              reduction=red, keepdim=keep, red_axis=axis, whole_channels=whole, tf32_reference=tf32ref))
    return out


def spec_key(spec) -> str:
    return _sha(repr(spec))[:16]


def spec_of(family: str, key: str) -> str:
    """The repr of the grid's spec whose key is ``key`` (for a message)."""
    specs = _gemm_specs() if family == "gemm" else _conv_specs()
    return next((repr(s) for s in specs if spec_key(s) == key), key)


def template_hashes() -> dict[str, dict[str, str]]:
    """The GEMM and conv templates called directly on their spec grids: ``{"gemm"|"conv": {spec key: sha256}}``,
    the key the first 16 hex digits of ``repr(spec)``'s sha256 (``spec_of`` finds the spec again); a spec the
    template refuses records its error class."""
    from kernellab.compiler.kernels import conv_kernel, gemm_kernel

    out: dict[str, dict[str, str]] = {"gemm": {}, "conv": {}}
    for family, specs, make in (("gemm", _gemm_specs(), gemm_kernel), ("conv", _conv_specs(), conv_kernel)):
        for spec in specs:
            try:
                ks = make(spec)
                text = ks.source + "\n" + json.dumps([ks.config, ks.space, ks.kernel_name, ks.launcher_name, ks.output],
                                                     sort_keys=True)
                out[family][spec_key(spec)] = _sha(text)
            except Exception as exc:  # noqa: BLE001
                out[family][spec_key(spec)] = _fault(exc)
    return out


def all_hashes(files: list[Path], workers: int = 2) -> dict[str, dict[str, str]]:
    names = [f"{p.parent.name}/{p.stem}" for p in files]
    # spawned, not forked: a fork of a process with threads (pytest's, after other tests) can inherit a held lock
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(zip(names, pool.map(hashes_of, [str(p) for p in files]), strict=True))


if __name__ == "__main__":
    import os
    import time

    os.environ.setdefault("TRITON_INTERPRET", "1")
    t0 = time.perf_counter()
    files = problem_files()
    if len(sys.argv) > 2:
        files = [f for f in files if any(s in f.stem for s in sys.argv[2:])]
    got = {**all_hashes(files), **{f"template/{k}": v for k, v in template_hashes().items()}}
    print(f"{len(got)} problems, {sum(len(v) for v in got.values())} sources, {time.perf_counter() - t0:.0f} s")
    if "--write" in sys.argv[1:2]:
        FIXTURE.write_text(json.dumps(got, indent=0, sort_keys=True) + "\n")
    else:
        want = json.loads(FIXTURE.read_text())
        diff = [k for k in got if got[k] != want.get(k)]
        print("differ:", diff)
