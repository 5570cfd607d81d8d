"""Would KernelBench's correctness check pass a problem's own reference? A control for cross-check disagreements.

    python experiments/kb_reference_control.py PROBLEM.py [--trials 2] [--device cpu|cuda] [--tolerance 1e-4]
    python experiments/kb_reference_control.py PROBLEM.py --harness .kb     # KernelBench's own eval (CUDA only)

Submits the problem's ``Model`` as ``ModelNew`` and repeats the order of KernelBench's
``run_and_check_correctness`` (``.kb/src/kernelbench/eval.py``): both models built from seed 42, per trial the
inputs drawn after seeding the trial's seed and cast to float32 (every tensor, indices included, as
``_process_input_tensor``), the reference called, then the candidate with no reseed in between,
``torch.allclose`` at the fp32 tolerance. A problem that draws random numbers in its forward (dropout in
training mode) draws them twice there, so the reference can fail against itself; kernellab reseeds before each
call (``sandbox._reference._reseed``) and checks the draws torch makes. Prints one line per trial: the verdict in
KernelBench's order and whether the two calls are equal when reseeded alike, or the reference's own error there
(exit 1 when a trial fails, 2 on bad input); ``--json``: one JSON line instead (``kb_crosscheck.py`` runs it so
on its disagreements). ``--harness DIR``: instead, KernelBench's own
``eval_kernel_against_ref`` from the checkout DIR judges the reference submitted as ``ModelNew`` (needs CUDA).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem", help="a KernelBench problem file")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="KernelBench's fp32 atol and rtol")
    ap.add_argument("--harness", metavar="DIR", help="a KernelBench checkout: judge with its own eval (CUDA)")
    ap.add_argument("--json", action="store_true", help="print one JSON line: passes, and the trials")
    args = ap.parse_args(argv)
    path = Path(args.problem)
    if not path.is_file():
        print(f"kb_reference_control: {path}: no such file", file=sys.stderr)
        return 2
    if args.harness:
        return _harness(path, Path(args.harness), args.trials)

    trials = replay(path, args.trials, args.device, args.tolerance)
    passes = all(t.get("pass") for t in trials)
    if args.json:
        print(json.dumps({"passes": passes, "trials": trials}))
        return 0 if passes else 1
    for t in trials:
        if "error" in t:
            print(f"trial {t['trial']}: the reference raises in KernelBench's order: {t['error']}")
        else:
            print(f"trial {t['trial']}: reference as candidate in KernelBench's order: "
                  f"{'pass' if t['pass'] else 'FAIL'} (max |diff| {t['max_diff']:.2e}, max |out| {t['max_out']:.2e}); "
                  f"reseeded alike: {'equal' if t['reseeded_equal'] else 'NOT equal'}")
    return 0 if passes else 1


def replay(path: Path, trials: int = 2, device: str = "cpu", tolerance: float = 1e-4) -> list[dict]:
    """Per trial: ``pass``, ``max_diff``, ``max_out`` and ``reseeded_equal``, or the reference's ``error``."""
    import torch

    spec = importlib.util.spec_from_file_location("kb_problem", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(42)
    ref = mod.Model(*mod.get_init_inputs()).to(device)
    torch.manual_seed(42)
    new = mod.Model(*mod.get_init_inputs()).to(device)
    torch.manual_seed(42)
    seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(trials)]
    out_trials: list[dict] = []
    with torch.no_grad():
        for t, seed in enumerate(seeds):
            torch.manual_seed(seed)
            inputs = [x.to(dtype=torch.float32, device=device) if isinstance(x, torch.Tensor) else x
                      for x in mod.get_inputs()]
            torch.manual_seed(seed)
            try:
                out = ref(*inputs)
            except Exception as exc:  # noqa: BLE001 - the reference's own failure is the finding
                out_trials.append({"trial": t, "pass": False, "error": f"{type(exc).__name__}: "
                                   f"{str(exc).splitlines()[0] if str(exc) else ''}"})
                continue
            out_new = new(*inputs)  # KernelBench's order: no reseed between the two calls
            ok = torch.allclose(out, out_new, atol=tolerance, rtol=tolerance)
            torch.manual_seed(seed + 1)
            a = ref(*inputs)
            torch.manual_seed(seed + 1)
            same = torch.equal(a, new(*inputs))
            out_trials.append({"trial": t, "pass": bool(ok), "max_diff": float((out - out_new).abs().max()),
                               "max_out": float(out.abs().max()), "reseeded_equal": bool(same)})
            del out, out_new, a
    return out_trials


def _harness(path: Path, kb: Path, trials: int) -> int:
    import torch

    if not (kb / "src" / "kernelbench" / "eval.py").is_file():
        print(f"kb_reference_control: --harness {kb}: not a KernelBench checkout (no src/kernelbench/eval.py)",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("kb_reference_control: --harness needs a CUDA device (KernelBench's eval is CUDA-only)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kb_crosscheck import import_kernelbench

    kb_eval = import_kernelbench(kb.resolve())
    src = path.read_text()
    with tempfile.TemporaryDirectory(prefix="kb-refctl-") as tmp:
        res = kb_eval.eval_kernel_against_ref(
            original_model_src=src, custom_model_src=src + "\nModelNew = Model\n", num_correct_trials=trials,
            num_perf_trials=1, measure_performance=False, backend="triton",
            precision=kb_eval.get_torch_dtype_from_string("fp32"), build_dir=tmp)
    md = (res.metadata if res is not None else {}) or {}
    detail = {k: md[k] for k in sorted(md) if "error" in k or "issue" in k or "difference" in k}
    verdict = None if res is None else res.correctness
    print(f"KernelBench's eval, the reference as ModelNew: compiled {None if res is None else res.compiled}, "
          f"correctness {verdict}; {json.dumps(detail, default=str)[:1000]}")
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
