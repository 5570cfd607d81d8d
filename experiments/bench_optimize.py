"""Whole models on the GPU host: ``kernellab.optimize`` on five KernelBench level-3 models and two models
from real model libraries (a timm ResNet-18 and a transformers BERT-base, random weights), end to end.

    PYTHONPATH=. python experiments/bench_optimize.py [--budget 12] [--time-budget 300] [--db optimize.db]
        [--kernelbench ../shared/kernelbench] [--models 1_MLP,4_LeNet5,...] [--out-dir experiments/results]

``--models`` takes level-3 file stems and ``package.module:factory`` specs, the inputs from
``package.module:factory_inputs`` or from a spec written ``package.module:factory@package.module:fn``
(experiments/models/library.py: ``experiments.models.library:timm_resnet``, ``...:hf_bert``); a
library that is not installed is an error row. For each model (by default a transformer block, a causal
attention, a ResNet block, two MLPs, a library ResNet and BERT): split into subgraphs, one campaign per deduplicated
subgraph with the builtin agents within ``--budget`` candidates and ``--time-budget`` seconds for the
model, patch the winners back, check the patched model end to end on fresh inputs, and time eager, the
patched model and torch.compile of the whole model side by side in one process. Writes
``<date>-<device>-optimize.json`` and ``.md`` under the results folder with the device, versions, commit
and date. A rerun with the same ``--db`` skips the finished subgraphs. On a machine without CUDA the
kernels are interpreted (SMALL sizes are needed and these files have none): it is meant for the GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernellab import _runtime, env  # noqa: E402
from kernellab import wholemodel as opt  # noqa: E402
from kernellab.progress import Progress  # noqa: E402

# this script is an entry point: the interpreter switch (no CUDA device) before any kernel is defined, the ast lock
_runtime.setup()

# ../shared/kernelbench beside the checkout, or KERNELBENCH_DIR (a GPU host gets a copy carried in the tree)
DEFAULT_KB = Path(os.environ.get("KERNELBENCH_DIR") or ROOT.parent / "shared" / "kernelbench")
# issue 15's five (results: experiments/results/2026-12-01-nvidia-h200-optimize-s9.md): a transformer block,
# a causal attention, a ResNet block and two MLPs; 4_LeNet5, 9_ResNet18 and 3_DeepNarrowMLP also split and
# trace (28_VisionTransformer's encoder layers are called with keyword arguments, which optimize leaves alone)
MODELS = ["44_MiniGPTBlock", "43_MinGPTCausalAttention", "8_ResNetBasicBlock", "1_MLP", "2_ShallowWideMLP"]
# their code, our kernels: eval mode, full size on a GPU (experiments/models/library.py)
LIBRARY = ["experiments.models.library:timm_resnet", "experiments.models.library:hf_bert"]


def load(item: str, kernelbench: Path, device: str) -> tuple:
    """A level-3 stem or a ``module:factory[@module:inputs]`` spec: (model, inputs, name, file)."""
    if ":" not in item:
        path = kernelbench / "level3" / f"{item}.py"
        model, inputs, _ = opt.load_model_spec(str(path), device=device)
        return model, inputs, item, str(path.relative_to(kernelbench))
    spec, _, inputs = item.partition("@")
    if not inputs:
        mod, _, attr = spec.partition(":")
        inputs = f"{mod}:{attr}_inputs"
    model, xs, name = opt.load_model_spec(spec, inputs, device=device)
    return model, xs, name, f"{spec} ({type(model).__module__}.{type(model).__qualname__})"


def run_one(item: str, args: argparse.Namespace, device: str) -> dict:
    model, inputs, name, file = load(item, args.kernelbench, device)
    t0 = time.monotonic()
    with Progress(plain=True) as progress:  # each campaign's steps in the log: a long one says where it is
        r = opt.optimize(model, inputs, db=args.db, name=name, budget=args.budget, time_budget_s=args.time_budget,
                         max_heavy=args.max_heavy, trials=args.trials, device=device, progress=progress,
                         inductor_seed=args.inductor_seed,
                         log=lambda s: print(f"  {s}", flush=True))
    r.pop("model")
    r["wall_s"] = time.monotonic() - t0
    r["file"] = file
    return r


def markdown(res: dict) -> str:
    lines = [f"# kernellab optimize: {len(res['models'])} models (KernelBench level 3, timm, transformers)", "",
             f"device {res['device']} · date {res['date']} · commit {res['versions'].get('commit')} · "
             f"torch {res['versions'].get('torch')} · triton {res['versions'].get('triton')}",
             f"budget per model: {res['budget']} candidates, {res['time_budget_s']} s; builtin agents"
             + ("; no torch.compile seed" if res.get("inductor_seed") is False else ""), "",
             "| model | correct end to end | patched share | our kernels' share | eager ms | patched ms | compile ms | vs eager | vs compile |",
             "|---|---|---|---|---|---|---|---|---|"]
    fx = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
    fm = lambda t, k: "-" if not t or k not in t else f"{t[k]['median_ms']:.4g}"  # noqa: E731
    for m in res["models"]:
        if "error" in m:
            lines.append(f"| {m['name']} | error: {m['error']} | | | | | | | |")
            continue
        t, c = m.get("timing") or {}, m.get("check")
        ok = "no kernel patched" if c is None else ("yes" if c["ok"] else "NO")
        patched = m.get("patched_share", m["covered_share"] or 0.0)  # results written before patched_share existed
        ours = "-" if m["covered_share"] is None else f"{m['covered_share']:.0%}"  # None: interpreted
        lines.append(f"| {m['name']} | {ok} | {patched:.0%} | {ours} | {fm(t, 'eager')} | {fm(t, 'patched')} | "
                     f"{fm(t, 'compile')} | {fx(t.get('speedup_vs_eager'))} | {fx(t.get('speedup_vs_compile'))} |")
    s = res["summary"]
    n = len(res["models"])
    lines += ["", f"kernel wins (correct end to end, our kernels carry most of the model's time) >= 1.1x faster than "
              f"torch.compile: {s['ge_1_1x_vs_compile']} of {n}; a kernel patched and correct end to end: "
              f"{s['correct']} of {n}; nothing patched: {s.get('unpatched', '-')}.", ""]
    for m in res["models"]:
        if "error" in m:
            continue
        lines += [f"## {m['name']}", "", "| subgraphs | share before | share after | winner | vs eager | lineage | state |",
                  "|---|---|---|---|---|---|---|"]
        for p in m["problems"]:
            w = p.get("winner")
            lineage = " > ".join(step["action"] for step in w["lineage"]) if w else "-"
            after = "-" if p["share_after"] is None or not p["patched"] else f"{p['share_after']:.1%}"
            lines.append(f"| {', '.join(p['units'])} | {p['share']:.1%} | {after} | {w['candidate'][:12] if w else '-'} | "
                         f"{fx(w['speedup_eager']) if w else '-'} | {lineage} | "
                         f"{'kernel' if p['patched'] else 'PyTorch'}: {p['outcome']}{opt.row_notes(p)} |")
        for sk in m["skipped"]:
            lines.append(f"| {sk['unit']} | {sk['share']:.1%} | - | - | - | - | PyTorch: {sk['reason']} |")
        lines.append("")
        for p in m["problems"]:
            if not p["patched"] and p.get("failures"):
                lines += [f"Failed candidates of {', '.join(p['units'])} (the first three):", ""]
                lines += [f"- {f}".replace("\n", " ") for f in p["failures"]] + [""]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernelbench", type=Path, default=DEFAULT_KB)
    ap.add_argument("--models", default=",".join(MODELS + LIBRARY),
                    help="Comma-separated level-3 file stems and package.module:factory[@package.module:inputs] specs.")
    ap.add_argument("--budget", type=int, default=12, help="Candidates per model, over all its subgraphs.")
    ap.add_argument("--time-budget", type=float, default=300.0, help="Seconds per model, over all its subgraphs.")
    ap.add_argument("--max-heavy", type=int, default=4)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-inductor-seed", dest="inductor_seed", action="store_false", default=None,
                    help="No torch.compile seed in the campaigns (on the H200 its compile took 40-70 s per "
                         "subgraph of a KernelBench-size model; the whole model's torch.compile is still timed).")
    ap.add_argument("--db", default="optimize-bench.db")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "experiments" / "results")
    ap.add_argument("--keep", type=Path, default=None,
                    help="An earlier run's results JSON: its models' rows are kept unless this run measures them "
                         "again (a bench longer than one call goes on in the next).")
    args = ap.parse_args()
    level3 = args.kernelbench / "level3"
    items = [m.strip() for m in args.models.split(",") if m.strip()]
    if any(":" not in m for m in items) and not level3.is_dir():
        print(f"bench_optimize: {level3}: no such folder (set KERNELBENCH_DIR or --kernelbench)", file=sys.stderr)
        return 2
    device = env.default_device()
    kept = json.loads(args.keep.read_text())["models"] if args.keep else []
    models: list[dict] = []
    now = dt.datetime.now(dt.timezone.utc)
    base = None
    for item in items:
        name = item.partition("@")[0].rpartition(":")[2]
        print(f"{name}:", flush=True)
        try:
            models.append({"name": name, **run_one(item, args, device)})
        except Exception as exc:  # one model's failure is a row of the results, not the end of the run
            models.append({"name": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            print(f"  error: {models[-1]['error']}", flush=True)
        # written after every model: a run cut off by a time limit keeps the models it finished
        res, base = write(args, device, now, [m for m in kept if m["name"] not in {x["name"] for x in models}] + models)
    if base is None:
        return 2
    print(markdown(res))
    print(f"results: {base}.json and {base}.md")
    failed = [m for m in res["models"] if "error" in m or (m["check"] is not None and not m["check"]["ok"])]
    return 1 if failed else 0


def write(args: argparse.Namespace, device: str, now: dt.datetime, models: list[dict]) -> tuple[dict, str]:
    ok = [m for m in models if "error" not in m]
    # a model with nothing patched is not counted correct: there is nothing of ours to be correct
    summary = {"correct": sum(1 for m in ok if m["check"] is not None and m["check"]["ok"]),
               "unpatched": sum(1 for m in ok if m["check"] is None),
               "ge_1_1x_vs_compile": sum(1 for m in ok if (m.get("timing") or {}).get("speedup_vs_compile", 0) >= 1.1
                                         and m["check"] and m["check"]["ok"] and (m["covered_share"] or 0.0) > 0.5),
               "covered_share": {m["name"]: m["covered_share"] for m in ok}}
    res = {"date": now.isoformat(timespec="seconds"), "device": env.device_name(device), "versions": env.versions(device),
           "commit": env.git_commit(), "budget": args.budget, "time_budget_s": args.time_budget,
           "max_heavy": args.max_heavy, "inductor_seed": args.inductor_seed, "models": models, "summary": summary}
    slug = re.sub(r"[^a-z0-9]+", "-", res["device"].lower()).strip("-")[:24]
    args.out_dir.mkdir(parents=True, exist_ok=True)
    base = str(args.out_dir / f"{now.strftime('%Y-%m-%d')}-{slug}-optimize")
    Path(f"{base}.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
    Path(f"{base}.md").write_text(markdown(res))
    return res, base


if __name__ == "__main__":
    sys.exit(main())
