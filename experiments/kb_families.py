"""A bench database's result by problem family: where the KernelBench run wins and where it misses.

    PYTHONPATH=. python experiments/kb_families.py --db bench.db [--db shard2.db] [--suite '.kb/level[12]/*.py']
        [--config-hash H] [--allow-library] [--name kb-public] [--out-dir experiments/results]

The problems are those of ``--suite`` (as ``kernellab bench`` reads a suite; the default is KernelBench's
public levels 1 and 2 carried in ``.kb``), so a problem the database has not finished counts as unfinished.
Each problem's row is the bench's own (``kernellab.bench``: the campaign that counts, ``problem_row``,
``pending_row``) under the bench configuration ``--config-hash`` (default: the only one in the database),
and each family's figures are ``kernellab.bench.summarize`` over that family's rows: problems, finished,
correct own-kernel winners (``vocab.counts_as_kernel_win``, unless ``--allow-library``), fast_1 against
eager and torch.compile, geomean speedups over the correct problems and over all problems (incorrect or
unfinished = 1.0x), failures by class. Added here: "correct" (a correct candidate of any kind, own-kernel
winner or not), the share of problems with a correct own-kernel winner against the 90% target, and per
problem without one a classified reason (not finished / no correct candidate, with the dominant error class
and its error text / a library-only winner / an own-kernel share below 0.5 / a failed winner re-timing); a
library-only miss also says what became of our own candidates. An own-kernel winner that a faster correct
candidate of mostly library time (cuDNN, cuBLAS) beats names it (``library_ahead``): there our kernel is correct
but slower than the library, and speed is the work that problem needs.

Families by :func:`family`: the file name (a level-2 file by its first op), the Model's ops when the name
says nothing. Writes ``<date>-<device>-<name>-families.md`` and ``.json`` under ``--out-dir``; exit 2 on bad
input (one line).
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "experiments" / "results"
DEFAULT_SUITE = ".kb/level[12]/*.py"
TARGET = 0.9  # the target: 90% of the problems with a correct own-kernel winner

# (key, label), in the order of the table
FAMILIES = (("gemm_epilogue", "GEMM+epilogue"), ("conv_epilogue", "conv+epilogue"),
            ("transposed_conv", "transposed conv"), ("reduction_norm", "reductions/norms"),
            ("pointwise", "pointwise"), ("pooling", "pooling"), ("attention", "attention"), ("other", "other"))
LABELS = dict(FAMILIES)

# Searched in a lowercased name or op; the leftmost match decides, and at one position the family listed
# first (a transposed conv before a conv, a pool before the reduction "max"). (?<![a-z])...(?![a-z]) keeps
# short words whole ("min" is not the one in "terminal"; "_" and digits separate words).
_W = r"(?<![a-z]){}(?![a-z])"
_PATTERNS = tuple((fam, re.compile(rx)) for fam, rx in (
    ("attention", r"attention|sdpa"),
    ("transposed_conv", r"conv_?transpose|deconv"),
    ("conv_epilogue", r"conv"),
    ("gemm_epilogue", r"gemm|matmul|bmm|addmm|linear|einsum|(?:matrix|vector)_multiplication|" + _W.format("mm")),
    ("pooling", r"(?:max|avg|average|global_?avg|adaptive_?(?:avg|max))?_?pool"),
    ("reduction_norm", r"softmax|logsumexp|norm|loss|cross_?entropy|kl_?div|nll|cumsum|cumprod|reduction|argmax|argmin|"
                       + _W.format("(?:sum|mean|max|min|prod|var|std|amax|amin|logsumexp)")),
    ("pointwise", r"relu|sigmoid|tanh|swish|silu|gelu|selu|elu|softplus|softsign|hardtanh|hardswish|hardsigmoid|mish|"
                  r"clamp|clip|dropout|pointwise|elementwise|scalar_multiplication|"
                  + _W.format("(?:add|sub|subtract|mul|multiply|div|divide|scale|scaling|biasadd|bias_add|exp|abs|"
                              "neg|sqrt|rsqrt|pow|where|maximum|minimum)")),
))
_BINOPS = {ast.MatMult: "matmul", ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.Pow: "pow"}


def _match(text: str) -> str | None:
    """The family of the leftmost pattern match in ``text`` (lowercased), None when none matches."""
    text = text.lower()
    hits = [(m.start(), k, fam) for k, (fam, rx) in enumerate(_PATTERNS) if (m := rx.search(text))]
    return min(hits)[2] if hits else None


def model_ops(source: str) -> list[str]:
    """The ops of ``class Model`` in the order its ``forward`` runs them (inner calls first): a call's name
    (``torch.relu`` -> ``relu``, ``x.sum`` -> ``sum``), a submodule by the class ``__init__`` gave it
    (``self.conv`` -> ``Conv2d``), an operator by name (``@`` -> ``matmul``). Empty when there is no Model."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    if model is None:
        return []
    layers: dict[str, str] = {}
    for fn in (n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"):
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                f = node.value.func
                kind = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
                for t in node.targets:
                    if kind and isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        layers[t.attr] = kind
    ops: list[str] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            visit(child)
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                ops.append(layers.get(f.attr, f.attr))
            elif isinstance(f, ast.Attribute):
                ops.append(f.attr)
            elif isinstance(f, ast.Name):
                ops.append(f.id)
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            ops.append(_BINOPS[type(node.op)])

    for fn in (n for n in model.body if isinstance(n, ast.FunctionDef) and n.name == "forward"):
        visit(fn)
    return ops


def family(name: str, source: str | None = None) -> str:
    """The family of problem ``name`` (a KernelBench file stem such as ``76_Gemm_Add_ReLU``; its leading
    number is dropped), one of :data:`FAMILIES`' keys.

    The name decides where it names an op: the leftmost op word found in it, so a fused level-2 problem
    goes by its first op (``6_Conv3d_Softmax_MaxPool_MaxPool`` is conv+epilogue). The words, by family:

    - attention: ``attention``, ``sdpa``;
    - transposed conv: ``ConvTranspose*``, ``conv_transposed``, ``deconv`` (before conv at one position);
    - conv+epilogue: any other ``conv`` (standard, depthwise, pointwise 1x1, separable; 1d/2d/3d);
    - GEMM+epilogue: ``gemm``, ``matmul``, ``bmm``, ``linear``, ``einsum``, ``mm``, ``matrix_multiplication``,
      ``vector_multiplication`` (level 1's "Square_matrix_multiplication", "Matrix_vector_multiplication");
    - pooling: ``MaxPool``, ``Max_Pooling``, ``Average_Pooling``, ``AvgPool`` ... (before the reduction ``max``);
    - reductions/norms: softmax, logsoftmax, logsumexp, every ``*norm`` (batch, layer, group, instance, RMS,
      Frobenius, L1, L2), ``*loss``, cross entropy, KL divergence, cumsum/cumprod, ``reduction``, argmax/argmin,
      and the words sum, mean, max, min, prod, var, std;
    - pointwise: activations (ReLU, LeakyReLU, sigmoid, tanh, swish/SiLU, GELU, SELU, ELU, softplus,
      softsign, hardtanh, hardswish, mish), clamp, dropout, ``pointwise``/``elementwise``, scalar
      multiplication ("5_Matrix_scalar_multiplication" is ``A * s``), and add/sub/mul/div/scale/bias-add...

    Where the name names no op (``mystery_block``) the same words are looked for in the ops of ``source``'s
    ``Model.forward`` (:func:`model_ops`: ``self.conv(x)`` is the ``nn.Conv2d`` of ``__init__``), and the
    heaviest family among them decides, in the order above (attention, transposed conv, conv, GEMM, pooling,
    reduction, pointwise): a hand-written loss (``mean(clamp(1 - p * t))``) is a reduction, not the pointwise
    op it starts with, and a pool before a conv is still a conv problem. Nothing found: ``other``."""
    found = _match(re.sub(r"^\d+_", "", name))
    if found is None and source:
        rank = {fam: k for k, (fam, _) in enumerate(_PATTERNS)}
        found = min((f for op in model_ops(source) if (f := _match(op))), key=rank.__getitem__, default=None)
    return found or "other"


class FamiliesError(Exception):
    """Bad input: printed as one line, exit 2."""


# -- reading the database through the bench's own functions ------------------------------------------------
def _hash_of(camp: dict) -> str | None:
    return ((camp.get("config") or {}).get("bench") or {}).get("config_hash")


def bench_hashes(stores: list[Any]) -> Counter:
    """config hash -> how many bench campaigns the databases hold under it."""
    return Counter(h for s in stores for c in s.list_campaigns() if (h := _hash_of(c)))


def _one_line(text: str | None, n: int = 140) -> str:
    """The line of an error text that says what went wrong: a traceback's last, else the first."""
    lines = [x.strip() for x in (text or "").splitlines() if x.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return line if len(line) <= n else line[: n - 1] + "…"


def miss(store: Any, camp: dict | None, row: dict, objective: str) -> dict:
    """Why a problem has no correct own-kernel winner: ``kind`` (not_finished, no_evaluation, no_correct,
    retime_failed, library_only, low_share) and a one-line ``reason``, read from its campaign's evaluations."""
    from kernellab.vocab import KERNEL_WIN_SHARE, Kind, Status, failed_winner_retime

    if not row.get("finished", True):
        text = f"not finished ({row.get('state') or 'unfinished'})"
        if camp is not None:
            full = store.evaluations(campaign_id=camp["id"], kind=Kind.FULL)
            if full:
                ok = sum(1 for e in full if e["status"] == Status.CORRECT)
                text += f"; {len(full)} evaluation(s) so far, {ok} correct"
        if row.get("campaign_error"):
            text += f"; {_one_line(row['campaign_error'], 100)}"
        return {"kind": "not_finished", "reason": text}
    nc = row.get("not_counted")
    if nc:
        full = store.evaluations(campaign_id=camp["id"], kind=Kind.FULL)
        if nc["reason"] == "library_only":
            own = store.reported_best(camp["id"], row["problem_id"], objective, library=False)
            detail = (f"no correct candidate runs kernels of its own ({_own_failures(full)})" if not own
                      else f"the best own-kernel candidate's share is {own[0]['own_kernel_share'] or 0:.2f} < "
                           f"{KERNEL_WIN_SHARE:g}")
            return {"kind": "library_only", "reason": f"correct, but the winner is library-only: {detail}"}
        share = nc.get("own_kernel_share")
        return {"kind": "low_share",
                "reason": f"correct, but the best own-kernel candidate runs {'?' if share is None else f'{share:.2f}'} "
                          f"of its GPU time in its own kernels (kernel win share below {KERNEL_WIN_SHARE:g})"}
    full = store.evaluations(campaign_id=camp["id"], kind=Kind.FULL)
    if not full:
        return {"kind": "no_evaluation", "reason": "finished without evaluating a candidate"}
    if any(e["status"] == Status.CORRECT for e in full):  # correct, but the store's best left them out
        bad = [e for e in store.evaluations(campaign_id=camp["id"], kind=Kind.RETIME)
               if failed_winner_retime(e)]
        last = bad[-1] if bad else {}
        return {"kind": "retime_failed",
                "reason": "correct evaluations, but the winner's fresh-job re-timing failed"
                          + (f": {last.get('error_class') or last.get('status')}: {_one_line(last.get('error_text'))}"
                             if last else "")}
    counts = row["failures"]
    cls, k = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    text = next((e["error_text"] for e in reversed(full) if (e["error_class"] or e["status"]) == cls), None)
    return {"kind": "no_correct", "error_class": cls,
            "reason": f"no correct candidate: {cls} in {k} of {len(full)} evaluation(s)"
                      + (f": {_one_line(text)}" if _one_line(text) else "")}


def library_ahead(store: Any, camp: dict, row: dict, objective: str) -> dict | None:
    """The correct candidate faster than the problem's own-kernel winner ``row`` that is no kernel win
    (library-only, or mostly library time: a cuDNN conv with our epilogue), or None: our kernel is correct
    there, and slower than the library."""
    from kernellab.vocab import counts_as_kernel_win

    top = store.reported_best(camp["id"], row["problem_id"], objective)
    if not top or top[0]["candidate_id"] == row.get("candidate_id") or counts_as_kernel_win(top[0]):
        return None
    v, mine = top[0].get(objective), row.get(objective)
    if v is None or mine is None or v <= mine:
        return None
    return {"candidate_id": top[0]["candidate_id"], "own_kernel_share": top[0]["own_kernel_share"] or 0.0,
            "library_only": bool(top[0]["library_only"]), objective: v,
            "action": (store.get_candidate(top[0]["candidate_id"]) or {}).get("action")}


def _own_failures(full: list[dict]) -> str:
    """What became of the candidates that run kernels of their own (of a campaign's evaluations ``full``), by
    status or error class."""
    counts: dict[str, int] = {}
    for e in full:
        if not e["library_only"]:
            key = e["error_class"] or e["status"]
            counts[key] = counts.get(key, 0) + 1
    return f"ours: {_by_class(counts)}" if counts else "none was evaluated"


def _by_class(counts: dict[str, int]) -> str:
    """``mismatch 2, compile_error 1``: most first."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def read(stores: list[Any], suite: str, config_hash: str | None = None, allow_library: bool = False) -> dict:
    """The suite's problems scored from ``stores`` (one database, or one per shard) as ``kernellab bench``
    scores them (``bench._Rows``: per problem the campaign that counts, ``problem_row``/``pending_row``), each
    with its family and, without a correct own-kernel winner, its ``miss``."""
    from kernellab.bench import _Rows, bench_campaigns, suite_paths
    from kernellab.problem import ProblemError, load_problem

    hashes = bench_hashes(stores)
    where = ", ".join(str(s.path) for s in stores)
    if config_hash is None:
        if not hashes:
            raise FamiliesError(f"{where}: no bench campaign (a database written by `kernellab bench`)")
        if len(hashes) > 1:
            raise FamiliesError(f"{where}: bench campaigns under {len(hashes)} configurations ("
                                + ", ".join(f"{h}: {n}" for h, n in hashes.most_common()) + "); pass --config-hash")
        config_hash = next(iter(hashes))
    elif config_hash not in hashes:
        raise FamiliesError(f"{where}: no bench campaign under config hash {config_hash}"
                            + (f" (there: {', '.join(hashes)})" if hashes else ""))
    camps = [(s, c) for s in stores for c in s.list_campaigns() if _hash_of(c) == config_hash]
    objective = (camps[-1][1]["config"] or {}).get("objective") or "speedup_eager"
    try:
        paths = suite_paths(suite)
        problems = [load_problem(p, validate_run=False) for p in paths]  # the id is the source's hash: no run needed
    except (FileNotFoundError, ProblemError) as exc:
        hint = (" (run from the checkout that carries .kb, or pass --suite, e.g. "
                "'../shared/kernelbench/level[12]/*.py')" if suite == DEFAULT_SUITE else "")
        raise FamiliesError(f"{exc}{hint}") from None
    reader = _Rows(stores, problems, paths, config_hash, objective, allow_library)
    rows = reader.all()
    index = [bench_campaigns(s, config_hash) for s in stores]  # once, not a scan of the campaigns per problem
    in_suite = {p.id for p in problems}
    outside = sorted({(s.get_problem(pid) or {}).get("name") or pid for s, c in camps
                      for pid in c["config"].get("problem_ids") or [] if pid not in in_suite})
    for prob, row in zip(problems, rows, strict=True):
        row["family"] = family(prob.name, prob.source)
        row["any_correct"] = bool(row.get("finished", True) and (row["correct"] or row.get("not_counted")))
        if not (row.get("finished", True) and row["correct"]):
            found = reader.campaigns(prob.id, index)
            k, camp = found[-1] if found else (0, None)
            row["miss"] = miss(stores[k], camp, row, objective)
        elif not allow_library:
            k, camp = reader.campaigns(prob.id, index)[-1]
            if (ahead := library_ahead(stores[k], camp, row, objective)) is not None:
                row["library_ahead"] = ahead
    return {"db": [str(s.path) for s in stores], "suite": suite, "config_hash": config_hash, "objective": objective,
            "allow_library": allow_library, "rows": rows, "outside_suite": outside}


# -- the table ---------------------------------------------------------------------------------------------
def family_row(key: str, rows: list[dict]) -> dict:
    """One line of the table: ``kernellab.bench.summarize`` over ``rows`` (the family's problems), plus the
    problems with any correct candidate, the share with a correct own-kernel winner, and the wins the
    family lacks for the :data:`TARGET`."""
    from kernellab.bench import summarize

    s = summarize(rows)
    n = s["problems"]
    return {"family": key, "label": LABELS.get(key, key), **s,
            "any_correct": sum(1 for r in rows if r.get("any_correct")),
            "win_share": s["correct"] / n if n else None,
            "short_of_target": max(0, math.ceil(TARGET * n - 1e-9) - s["correct"]),
            "misses": dict(Counter(r["miss"]["kind"] for r in rows if r.get("miss")))}


def tabulate(data: dict) -> dict:
    """Per family (in :data:`FAMILIES`' order, those with problems) and ``all``: :func:`family_row`; the
    misses, family by family."""
    rows = data["rows"]
    table = [family_row(k, [r for r in rows if r["family"] == k]) for k, _ in FAMILIES
             if any(r["family"] == k for r in rows)]
    table.append(family_row("all", rows))
    order = {k: i for i, (k, _) in enumerate(FAMILIES)}
    misses = [{"problem": r["problem"], "family": r["family"], **r["miss"]}
              for r in sorted(rows, key=lambda r: (order[r["family"]], _number(r["path"]), r["problem"])) if r.get("miss")]
    return {"table": table, "misses": misses}


def _number(path: str) -> tuple:
    """KernelBench order: (level folder, the file's number)."""
    p = Path(path)
    m = re.match(r"(\d+)_", p.name)
    return (p.parent.name, int(m.group(1)) if m else 10**9)


def _f(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None else fmt.format(v)


def _fast(r: dict, base: str) -> str:
    v = r[f"fast_1_{base}"]
    return "-" if v is None else f"{round(v * r['problems'])} ({v:.2f})"


def to_markdown(result: dict) -> str:
    from kernellab.vocab import KERNEL_WIN_SHARE

    total = result["table"][-1]
    lines = [f"# `{result['suite']}` by family — {result['date']}", "",
             f"Database{'s' if len(result['db']) > 1 else ''} {', '.join(f'`{d}`' for d in result['db'])}, "
             f"bench configuration {result['config_hash']} (objective "
             f"{result['objective']}), results from {', '.join(result['devices']) or 'no device'}; "
             f"kernellab {result['commit']}.", "",
             f"**{total['finished']} of {total['problems']} problems finished.** Every figure is over all the "
             "problems of its family: an unfinished problem counts as not correct and not fast, and in the geomean "
             "over all problems as 1.0x (`kernellab.bench.summarize`, the bench page's own numbers).", "",
             "*correct*: a correct candidate of any kind; *own-kernel wins*: a correct own-kernel winner, the bench's "
             f"kernel win (not library-only, at least {KERNEL_WIN_SHARE:g} of its GPU time in its own kernels"
             + (", library-only allowed: --allow-library" if result["allow_library"] else "") + "); "
             f"*short*: the own-kernel wins the family lacks for the {TARGET:.0%} target. fast_1: problems "
             "whose own-kernel winner beats the baseline (median and, re-timed, its p20-p80 band), with their "
             "share of the family's problems.", "",
             "| family | problems | finished | correct | own-kernel wins | share (target 90%) | short | "
             "fast_1 eager | fast_1 compile | geomean eager, correct | geomean compile, correct | "
             "geomean eager, all | geomean compile, all | failures by class |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["table"]:
        name = f"**{r['label']}**" if r["family"] == "all" else r["label"]
        fails = _by_class(r["failures"]) or "-"
        lines.append(f"| {name} | {r['problems']} | {r['finished']} | {r['any_correct']} | {r['correct']} | "
                     f"{_f(r['win_share'], '{:.0%}')} | {r['short_of_target']} | {_fast(r, 'eager')} | "
                     f"{_fast(r, 'compile')} | {_f(r['geomean_eager_correct'], '{:.2f}x')} | "
                     f"{_f(r['geomean_compile_correct'], '{:.2f}x')} | {_f(r['geomean_eager_all'], '{:.2f}x')} | "
                     f"{_f(r['geomean_compile_all'], '{:.2f}x')} | {fails} |")
    if total["interpreted"]:
        lines += ["", "**Interpreted (CPU) results among them: correctness only, no speedup is claimed.**"]
    kinds = ("not_finished", "no_evaluation", "no_correct", "retime_failed", "library_only", "low_share")
    heads = ("not finished", "nothing evaluated", "no correct candidate", "winner re-timing failed",
             "library-only winner", f"share < {KERNEL_WIN_SHARE:g}")
    lines += ["", f"## Misses by reason ({len(result['misses'])} problems without a correct own-kernel winner)", "",
              "| family | " + " | ".join(heads) + " |", "|---" * (len(kinds) + 1) + "|"]
    for r in result["table"]:
        name = f"**{r['label']}**" if r["family"] == "all" else r["label"]
        lines.append(f"| {name} | " + " | ".join(str(r["misses"].get(k, 0)) for k in kinds) + " |")
    key = result["objective"]
    ahead = [r for r in result["problems"] if r.get("library_ahead")]
    if ahead:
        beat = sum(1 for r in ahead if (r[key] or 0) <= 1.0 < r["library_ahead"][key])
        lines += ["", f"## Own-kernel winners behind a library candidate ({len(ahead)})", "",
                  f"A faster correct candidate of mostly library time (share < {KERNEL_WIN_SHARE:g}) beats our kernel on "
                  f"these; on {beat} of them it beats {key.removeprefix('speedup_')} where ours does not. Our kernel's "
                  "speed, not its correctness, is what they lack.", ""]
        lines += [f"- `{r['problem']}` ({LABELS[r['family']]}): ours {_f(r[key], '{:.2f}x')}, share "
                  f"{_f(r['own_kernel_share'])}; the library path {_f(r['library_ahead'][key], '{:.2f}x')}, share "
                  f"{_f(r['library_ahead']['own_kernel_share'])} ({r['library_ahead']['action'] or 'seed'})"
                  for r in sorted(ahead, key=lambda r: (_number(r["path"]), r["problem"]))]
    lines += ["", "## Misses", ""]
    lines += [f"- `{m['problem']}` ({LABELS[m['family']]}): {m['reason']}" for m in result["misses"]] or ["none"]
    lines += ["", "## Families", "", "By `kb_families.family`: the file name's leftmost op word (a level-2 file by "
              "its first op), the Model's ops where the name names none.", ""]
    for k, label in FAMILIES:
        names = [p["problem"] for p in result["problems"] if p["family"] == k]
        if names:
            lines.append(f"- **{label}** ({len(names)}): " + ", ".join(f"`{n}`" for n in names))
    if result["outside_suite"]:
        lines += ["", f"The database also holds {len(result['outside_suite'])} problem(s) of this configuration "
                      f"outside the suite (not counted): {', '.join(result['outside_suite'])}."]
    return "\n".join(lines) + "\n"


def build(stores: Any, suite: str, config_hash: str | None = None, allow_library: bool = False) -> dict:
    """The whole result (what the JSON holds): settings, the table, the misses and each problem's row."""
    from kernellab import env

    data = read(list(stores) if isinstance(stores, list | tuple) else [stores], suite, config_hash, allow_library)
    order = {k: i for i, (k, _) in enumerate(FAMILIES)}
    # an unfinished row's figures are its campaign's so far: they never count (the bench's rule), so they are not
    # put beside the verdict
    keep = ("not_counted", "speedup_eager", "speedup_compile", "win_eager", "win_compile", "own_kernel_share",
            "library_ahead")
    problems = [{"problem": r["problem"], "path": r["path"], "family": r["family"], "finished": r.get("finished", True),
                 "state": r.get("state"), "any_correct": r["any_correct"],
                 "own_kernel_win": bool(r.get("finished", True) and r["correct"]), "failures": r["failures"],
                 **({k: r.get(k) for k in keep} if r.get("finished", True) else {}), "miss": r.get("miss")}
                for r in sorted(data["rows"], key=lambda r: (order[r["family"]], _number(r["path"]), r["problem"]))]
    return {"db": data["db"], "suite": suite, "config_hash": data["config_hash"], "objective": data["objective"],
            "allow_library": allow_library, "target": TARGET,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "devices": sorted({r["device"] for r in data["rows"] if r.get("finished") and r.get("device")}),
            "commit": env.git_commit(), **tabulate(data), "outside_suite": data["outside_suite"], "problems": problems}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, action="append", help="A database written by `kernellab bench` "
                    "(repeated: one per shard, scored together as `bench --summary-only` does)")
    ap.add_argument("--suite", default=DEFAULT_SUITE, help=f"The suite's problems, as `kernellab bench` reads a "
                    f"suite (default {DEFAULT_SUITE!r}): problems the database lacks count as unfinished")
    ap.add_argument("--config-hash", default=None, help="The bench configuration to score (default: the only one)")
    ap.add_argument("--allow-library", action="store_true", help="Count library-only winners too (bench --allow-library)")
    ap.add_argument("--name", default="kb", help="Names the files: <date>-<device>-<name>-families.md/.json")
    ap.add_argument("--out-dir", default=str(RESULTS))
    args = ap.parse_args(argv)
    try:
        return _main(args)
    except FamiliesError as exc:
        print(f"kb_families: error: {exc}", file=sys.stderr)
        return 2


def _main(args: argparse.Namespace) -> int:
    from kernellab.bench import _stem
    from kernellab.fileio import write_atomic
    from kernellab.store import Store, StoreError

    stores = []
    for db in args.db:
        if not Path(db).is_file():
            raise FamiliesError(f"{db}: no such database")
        try:
            stores.append(Store(db))
        except StoreError as exc:
            raise FamiliesError(str(exc)) from None
    result = build(stores, args.suite, args.config_hash, args.allow_library)
    stamp = dt.datetime.fromisoformat(result["date"])
    stem = Path(args.out_dir) / _stem(stamp, result["devices"][0] if result["devices"] else "none",
                                      f"{args.name}-families", None)
    write_atomic(stem.with_suffix(".json"), json.dumps(result, indent=2, default=str))
    write_atomic(stem.with_suffix(".md"), to_markdown(result))
    t = result["table"][-1]
    print(f"kb_families: {t['correct']} of {t['problems']} problems with a correct own-kernel winner "
          f"({t['finished']} finished), {len(result['misses'])} misses; {stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
