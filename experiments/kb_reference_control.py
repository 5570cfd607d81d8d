"""Would KernelBench's correctness check pass a problem's own reference? A control for cross-check disagreements.

    python experiments/kb_reference_control.py PROBLEM.py [--trials 2] [--device cpu|cuda] [--tolerance 1e-4]

Submits the problem's ``Model`` as ``ModelNew`` and repeats the order of KernelBench's
``run_and_check_correctness`` (``.kb/src/kernelbench/eval.py``): both models built from seed 42, per trial the
inputs drawn after seeding the trial's seed and cast to float32 (every tensor, indices included, as
``_process_input_tensor``), the reference called, then the candidate with no reseed in between,
``torch.allclose`` at the fp32 tolerance. A problem that draws random numbers in its forward (dropout in
training mode) draws them twice there, so the reference can fail against itself; kernellab reseeds before each
call (``sandbox._reference._reseed``) and checks the draws torch makes. Prints one line per trial: the verdict in
KernelBench's order and whether the two calls are equal when reseeded alike, or the reference's own error there
(exit 1 when a trial fails, 2 on bad input).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("problem", help="a KernelBench problem file")
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tolerance", type=float, default=1e-4, help="KernelBench's fp32 atol and rtol")
    args = ap.parse_args(argv)
    path = Path(args.problem)
    if not path.is_file():
        print(f"kb_reference_control: {path}: no such file", file=sys.stderr)
        return 2
    import torch

    spec = importlib.util.spec_from_file_location("kb_problem", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(42)
    ref = mod.Model(*mod.get_init_inputs()).to(args.device)
    torch.manual_seed(42)
    new = mod.Model(*mod.get_init_inputs()).to(args.device)
    torch.manual_seed(42)
    seeds = [torch.randint(0, 2**32 - 1, (1,)).item() for _ in range(args.trials)]
    failed = 0
    with torch.no_grad():
        for t, seed in enumerate(seeds):
            torch.manual_seed(seed)
            inputs = [x.to(dtype=torch.float32, device=args.device) if isinstance(x, torch.Tensor) else x
                      for x in mod.get_inputs()]
            torch.manual_seed(seed)
            try:
                out = ref(*inputs)
            except Exception as exc:  # noqa: BLE001 - the reference's own failure is the finding
                print(f"trial {t}: the reference raises in KernelBench's order: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0] if str(exc) else ''}")
                failed += 1
                continue
            out_new = new(*inputs)  # KernelBench's order: no reseed between the two calls
            ok = torch.allclose(out, out_new, atol=args.tolerance, rtol=args.tolerance)
            torch.manual_seed(seed + 1)
            a = ref(*inputs)
            torch.manual_seed(seed + 1)
            same = torch.equal(a, new(*inputs))
            failed += not ok
            print(f"trial {t}: reference as candidate in KernelBench's order: {'pass' if ok else 'FAIL'} "
                  f"(max |diff| {float((out - out_new).abs().max()):.2e}, max |out| {float(out.abs().max()):.2e}); "
                  f"reseeded alike: {'equal' if same else 'NOT equal'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
