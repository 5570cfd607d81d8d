"""Export the best candidate of a problem as one standalone Python file.

The file is the candidate's source with the best evaluation's ``CONFIG`` baked in (a
``CONFIG.update(...)`` right after the candidate's own ``CONFIG``, whose values are the sandbox's
nested merge of the config into it, ``kernellab.vocab.apply_config``), under a header saying where it
came from. A candidate whose
``ModelNew`` subclasses a ``Model`` it does not define gets the problem's source prepended, so the
file imports on its own. Because ``ModelNew`` subclasses ``Model`` and keeps its parameter names,
``ModelNew(*init).load_state_dict(Model(*init).state_dict())`` loads the original weights.
"""

from __future__ import annotations

import ast
import copy
import hashlib
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from kernellab import _runtime
from kernellab.fileio import write_atomic
from kernellab.vocab import ConfigError, SpaceError, apply_config, read_space

__all__ = ["ExportError", "NoCorrectCandidate", "best_candidate", "export_source", "export", "load_best"]


class ExportError(ValueError):
    """The export cannot be made from this input (unknown campaign or problem, ambiguous problem)."""


class NoCorrectCandidate(ExportError):
    """The problem has no correct candidate to export (the work failed, not the input)."""


def _open(db: Any) -> Any:
    if hasattr(db, "best"):
        return db
    from kernellab.store import Store

    if str(db) != ":memory:" and not Path(db).exists():
        raise ExportError(f"{db}: no such database")
    return Store(db)


def best_candidate(store: Any, campaign: str, problem: str | None = None, library: bool = True) -> dict:
    """The reported best evaluation of ``problem`` (name or id; may be omitted when the campaign has
    one problem) in ``campaign`` (``store.reported_best``: the winner under the campaign's objective,
    as re-timed in a fresh job when it was), with its ``candidate``, ``problem`` and ``campaign`` rows.
    ``library=False``: the best kernel win (a bench's winner: at least half of its GPU time in kernels of its own)."""
    camp = store.get_campaign(campaign)
    if camp is None:
        raise ExportError(f"no campaign {campaign!r} in {store.path}")
    pids: list[str] = []
    for c in store.candidates(camp["id"]):
        if c["problem_id"] not in pids:
            pids.append(c["problem_id"])
    rows = {pid: store.get_problem(pid) for pid in pids}
    if problem is None:
        if len(pids) != 1:
            names = ", ".join(sorted(r["name"] for r in rows.values())) or "none"
            raise ExportError(f"campaign {camp['name']!r} has {len(pids)} problems ({names}): choose one with --problem")
        pid = pids[0]
    else:
        matches = [pid for pid, r in rows.items() if problem in (pid, r["name"])]
        if not matches:
            names = ", ".join(sorted(r["name"] for r in rows.values())) or "none"
            raise ExportError(f"campaign {camp['name']!r} has no problem {problem!r} (it has: {names})")
        pid = matches[0]
    best = store.reported_best(camp["id"], pid, library=library, kernel=not library)
    if not best:
        raise NoCorrectCandidate(f"problem {rows[pid]['name']!r} has no correct candidate in campaign {camp['name']!r}")
    return {"evaluation": best[0], "candidate": store.get_candidate(best[0]["candidate_id"]),
            "problem": rows[pid], "campaign": camp}


def _module_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for n in tree.body:
        if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(n.name)
        elif isinstance(n, ast.Assign):
            names |= {t.id for t in n.targets if isinstance(t, ast.Name)}
        elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
            names.add(n.target.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in n.names}
    return names


def _split_future(source: str) -> tuple[list[str], str]:
    """``from __future__`` lines (which must open a file) and the source without them."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    future, drop = [], set()
    for n in tree.body:
        if isinstance(n, ast.ImportFrom) and n.module == "__future__":
            future.append("".join(lines[n.lineno - 1:n.end_lineno]).strip())
            drop |= set(range(n.lineno - 1, n.end_lineno))
    return future, "".join(line for i, line in enumerate(lines) if i not in drop)


def _bake(source: str, config: dict) -> str:
    """Insert the tuned values after the candidate's last module-level ``CONFIG`` assignment.

    The sandbox applies a config as a nested merge (``kernellab.vocab.apply_config``): a per-kernel
    entry changes only the parameters it names. ``CONFIG.update`` would replace the kernel's whole
    entry, so the baked values are the merged entries, computed here on the ``CONFIG`` literal; a
    ``CONFIG`` that is not a literal gets the config as it is."""
    if not config:
        return source
    try:
        space, literal = read_space(source)
    except SpaceError:
        space, literal = None, None
    if isinstance(literal, dict):
        try:
            merged = apply_config(copy.deepcopy(literal), config, space if isinstance(space, dict) else None)
            config = {k: merged[k] for k in config}
        except ConfigError:  # the sandbox refused such a config too: no evaluation carries one
            pass
    tree = ast.parse(source)
    last = None
    for n in tree.body:
        targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == "CONFIG" for t in targets):
            last = n
    baked = ("# kernellab export: the tuned configuration of the best evaluation\n"
             + (f"CONFIG.update({config!r})\n" if last is not None else f"CONFIG = {config!r}\n"))
    if last is None:
        return source.rstrip("\n") + "\n\n\n" + baked
    lines = source.splitlines(keepends=True)
    head, tail = "".join(lines[:last.end_lineno]), "".join(lines[last.end_lineno:])
    return head.rstrip("\n") + "\n" + baked + tail


def _header(b: dict) -> str:
    e, c, p, camp = b["evaluation"], b["candidate"], b["problem"], b["campaign"]
    timing = f"median {e['median_ms']:.4g} ms (p20 {e['p20_ms']:.4g}, p80 {e['p80_ms']:.4g})" \
        if e.get("median_ms") is not None and e.get("p20_ms") is not None and e.get("p80_ms") is not None else "not timed"
    if e["interpreted"]:
        claim = "timings are interpreted (Triton interpreter on CPU): no speedup is claimed"
    else:
        fx = lambda v: "-" if v is None else f"{v:.3g}x"
        fb = lambda b: "" if not b else f" (p20-p80 {b[0]:.3g}-{b[1]:.3g}x)"
        claim = (f"speedup vs eager {fx(e['speedup_eager'])}{fb(e.get('speedup_eager_p20_p80'))}, "
                 f"vs torch.compile {fx(e['speedup_compile'])}{fb(e.get('speedup_compile_p20_p80'))}")
    claim += ("; re-timed in a fresh job" if e.get("retimed")
              else "; not re-timed (the best of all its evaluations)")
    return (f'"""kernellab export: the best candidate for problem {p["name"]!r} in campaign {camp["name"]!r}.\n\n'
            f"candidate  {c['id']} (depth {c['depth']}, origin {c['origin']}, language {c['language']})\n"
            f"action     {c['action'] or '(root)'}\n"
            f"evaluation {e['id']}: {e['status']} on {e['device']}, {timing}\n"
            f"           {claim}\n"
            f"config     {e.get('config') or {}}\n\n"
            "Load the original model's weights:\n"
            "    model = ModelNew(*init_inputs)\n"
            "    model.load_state_dict(reference_model.state_dict())\n"
            '"""\n')


def export_source(store: Any, campaign: str, problem: str | None = None, library: bool = True) -> str:
    """The standalone file's text for the best candidate of ``problem`` in ``campaign`` (``library``: as
    :func:`best_candidate`)."""
    b = best_candidate(store, campaign, problem, library=library)
    src = _bake(b["candidate"]["source"], b["evaluation"].get("config") or {})
    tree = ast.parse(src)
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    parts = [src]
    if "Model" in used and "Model" not in _module_names(tree):
        psrc = b["problem"]["source"]
        if "KERNELLAB_ARTIFACTS" in psrc:
            raise ExportError(f"problem {b['problem']['name']!r} wraps a live model (Problem.from_module): "
                              "its Model cannot be written into a standalone file")
        parts = ["# ---- the problem's reference source (Model), which ModelNew subclasses ----\n" + psrc,
                 "# ---- the candidate ----\n" + src]
    future: list[str] = []
    body = []
    for part in parts:
        fut, rest = _split_future(part)
        future += [f for f in fut if f not in future]
        body.append(rest.strip("\n") + "\n")
    return _header(b) + "".join(f + "\n" for f in future) + "\n" + _INTERPRETER + "\n\n" + "\n\n".join(body)


# Triton decides at ``@triton.jit`` time whether a kernel is compiled for a GPU or interpreted, so the
# choice is made before the candidate's kernels are defined; on a machine without a CUDA device the
# only way to run them is the interpreter ("0 active drivers" otherwise).
_INTERPRETER = """\
# kernellab export: without a CUDA device the Triton kernels below run in the Triton interpreter
# (slow, for checking on a laptop); set TRITON_INTERPRET yourself to override this choice.
import os as _os

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"
"""


def _safe(name: str) -> str:
    return re.sub(r"\W", "_", name).strip("_") or "problem"


def export(store: Any, campaign: str, problem: str | None = None, path: str | Path | None = None) -> tuple[Path, dict]:
    """Write the standalone file (default ``exports/best_<problem>.py``); returns the path and the record."""
    _runtime.setup()  # the interpreter switch and the ast lock, before any work (kernellab._runtime)
    store = _open(store)
    b = best_candidate(store, campaign, problem)
    out = Path(path) if path else Path("exports") / f"best_{_safe(b['problem']['name'])}.py"
    write_atomic(out, export_source(store, campaign, b["problem"]["id"]))
    return out, b


def load_best(db: Any, campaign: str, problem: str | None = None) -> type:
    """The ``ModelNew`` class of the best candidate, imported from its exported file.

    Triton reads a kernel's source from its file, so the export is written to a file (named by the
    hash of its text, under the temp directory) and imported from there, not exec'd from a string.
    Without a CUDA device (and no ``TRITON_INTERPRET`` set) the runtime setup (``kernellab._runtime``, made
    here or by the campaign run in this process before) and the file's header switch Triton to its interpreter
    before any kernel is defined, and this says so on stderr.
    """
    _runtime.setup()  # the interpreter switch and the ast lock, before any work (kernellab._runtime)
    store = _open(db)
    text = export_source(store, campaign, problem)
    if _runtime.interpreter_chosen or ("TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available()):
        # the runtime setup (and the file's own header) made this choice; said once here, where the
        # user did not read it
        print("kernellab: no CUDA device: the exported kernels run in the Triton interpreter "
              "(TRITON_INTERPRET=1)", file=sys.stderr)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    name = f"kernellab_best_{digest}"
    if name in sys.modules:
        return sys.modules[name].ModelNew
    folder = Path(tempfile.gettempdir()) / "kernellab-exports"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        write_atomic(path, text)  # two processes loading the same export never see half a file
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    if not hasattr(module, "ModelNew"):
        raise ExportError(f"the exported candidate defines no ModelNew ({path})")
    return module.ModelNew
