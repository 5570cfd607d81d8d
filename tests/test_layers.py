"""The package tree has no import circle: no kernellab module, while it is being imported, imports (directly or
through others) a module whose import led to it. Circles are what made the layers unreadable (issue 33): a
module-level import that runs upward ties two layers into one, and works or fails by import order.

Only module-level imports count, the ones that run when the module is imported (also those under a top-level
``if``/``try`` and in class bodies); an import inside a function runs when it is called, after every module is
loaded, and is how a lower layer reaches a higher one honestly. ``if TYPE_CHECKING:`` blocks never run."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "kernellab"


def _modules() -> dict[str, Path]:
    """Every module of the tree by dotted name (a package by its ``__init__.py``)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module is imported: not inside a function, not under
    ``if TYPE_CHECKING``."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                found.append(node)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            elif isinstance(node, ast.If):
                if not _is_type_checking(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.ClassDef | ast.With | ast.For | ast.While):
                visit(node.body)
                visit(getattr(node, "orelse", []))
            elif isinstance(node, ast.Try):
                visit(node.body)
                for h in node.handlers:
                    visit(h.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(tree.body)
    return found


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, those inside functions too."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _edges(name: str, path: Path, modules: dict[str, Path], everywhere: bool = False) -> set[str]:
    """The kernellab modules the module-level imports of ``name`` execute (or need finished). Importing ``a.b.c``
    runs ``a`` and ``a.b`` first, except a package the importer is inside: that one is already being imported
    (a package's ``__init__`` re-exporting its submodules is not a circle). ``from P import name`` needs P's body
    to have run up to ``name``, unless ``name`` is a submodule of P, which is imported on its own."""
    is_pkg = path.name == "__init__.py"
    inside = set(_ancestors(name)) | ({name} if is_pkg else set())
    targets: set[str] = set()

    def need(target: str, body: bool = True) -> None:
        for anc in _ancestors(target):
            if anc in modules and anc not in inside:
                targets.add(anc)
        if body and target in modules and target not in inside:
            targets.add(target)

    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in (_all_imports if everywhere else _module_level_imports)(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                need(alias.name)
            continue
        if node.level:
            base = name.split(".") if is_pkg else name.split(".")[:-1]
            base = base[:len(base) - (node.level - 1)]
            origin = ".".join(base + ([node.module] if node.module else []))
        else:
            origin = node.module or ""
        for alias in node.names:
            sub = f"{origin}.{alias.name}"
            if sub in modules:
                need(origin, body=False)
                need(sub)
            else:
                need(origin)
    return targets - {name}


def import_graph(everywhere: bool = False) -> dict[str, set[str]]:
    """module -> the kernellab modules its module-level imports execute (or need finished); ``everywhere``:
    with the imports inside functions too."""
    modules = _modules()
    return {name: _edges(name, path, modules, everywhere) for name, path in modules.items()}


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        v = todo.pop()
        if v == goal:
            return True
        if v not in seen:
            seen.add(v)
            todo += graph.get(v, ())
    return False


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _path_in(graph: dict[str, set[str]], comp: list[str]) -> list[str]:
    """One shortest circle through the component's first module, for the message."""
    start, members = comp[0], set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [*reversed(path), start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def test_the_graph_sees_the_tree():
    """The walk finds the layers and their arrows (a graph with no edges would pass the test below trivially)."""
    graph = import_graph()
    for name in ("kernellab", "kernellab.vocab", "kernellab.store", "kernellab.search._tune",
                 "kernellab.sandbox._job", "kernellab.agents.builtin.build"):
        assert name in graph
    assert "kernellab.vocab" in graph["kernellab.search._tune"]
    assert "kernellab.compiler.ir" in graph["kernellab.agents.builtin.build"]


def test_no_module_level_import_circle():
    graph = import_graph()
    cycles = find_cycles(graph)
    assert not cycles, "import circles among kernellab modules:\n" + "\n".join(
        " -> ".join(_path_in(graph, c)) + f"   (component: {', '.join(c)})" for c in cycles)


def test_the_package_init_imports_nothing():
    """kernellab/__init__.py only re-exports, lazily: importing any module of the tree runs no other layer
    (before issue 33 it imported optimize, campaign and export, so ``import kernellab.vocab`` imported torch
    and the circle __init__ -> optimize -> search -> _tune -> kernellab ran through it)."""
    assert import_graph(everywhere=True)["kernellab"] == set()


def test_the_circles_issue_33_named_stay_broken():
    """Counting the imports inside functions too: the campaign does not reach the study (nor the bench) that
    builds on it, and a sandbox job does not reach the worker process that runs it. (problem <-> small stays
    a circle through functions, on purpose: the small instance is found by building the problem at trial
    sizes, so Problem.module(small=True), settings() and validate reach kernellab.small at call time.)"""
    graph = import_graph(everywhere=True)
    assert not _reaches(graph, "kernellab.campaign", "kernellab.study")
    assert not _reaches(graph, "kernellab.campaign", "kernellab.bench")
    assert not _reaches(graph, "kernellab.sandbox._job", "kernellab.sandbox._worker")
    assert "kernellab.small" not in import_graph()["kernellab.problem"]


# What the compiler (kernellab/compiler/) stands on: the problem and its small instance, the trace lock. It is a
# layer below the agents (the builtin agents drive it), so none of its imports, not even one inside a function,
# names the agents, the campaign, the search, the store, the sandbox or the commands above them.
COMPILER = "kernellab.compiler"
COMPILER_MAY_IMPORT = {"kernellab", "kernellab.problem", "kernellab.small", "kernellab._tracing", "kernellab.vocab"}


def test_the_compiler_is_a_layer_below_the_agents():
    everywhere = import_graph(everywhere=True)
    compiler = [m for m in everywhere if m == COMPILER or m.startswith(COMPILER + ".")]
    assert f"{COMPILER}.lowering" in compiler and f"{COMPILER}.kernels.gemm" in compiler
    upward = {m: sorted(t for t in everywhere[m] if not t.startswith(COMPILER) and t not in COMPILER_MAY_IMPORT)
              for m in compiler}
    assert not any(upward.values()), f"the compiler imports above its layer: { {m: t for m, t in upward.items() if t} }"
    module_level = import_graph()
    for up in ("kernellab.agents", "kernellab.campaign", "kernellab.sandbox", "kernellab.cli", "kernellab.search",
               "kernellab.store", "kernellab.optimize"):
        assert not [m for m in compiler if _reaches(module_level, m, up)], up
    # and the agents stand on it: the builtin's build replays actions through the compiler
    assert {f"{COMPILER}.capture", f"{COMPILER}.codegen", f"{COMPILER}.partition"} <= module_level[
        "kernellab.agents.builtin.build"]


def test_the_finder_sees_a_circle():
    """find_cycles itself: a circle of three and a package re-exporting its own submodule (not a circle)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "p": {"p.x"}, "p.x": set()}
    assert find_cycles(graph) == [["a", "b", "c"]]
