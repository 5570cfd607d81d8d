"""Importing kernellab changes nothing in the process; the entry points make the process-wide settings
(the Triton interpreter without a CUDA device, the ast.parse lock) through one explicit, idempotent call:
``kernellab._runtime.setup()`` (issue 33)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kernellab
from kernellab import _runtime

ROOT = Path(__file__).resolve().parent.parent


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter, without the TRITON_INTERPRET this suite sets (a newcomer's shell)."""
    base = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       cwd=ROOT, env={**base, **env})
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def test_vocab_imports_without_torch():
    """kernellab.vocab is standard library only, and importing it through the package imports nothing else."""
    _fresh("import kernellab.vocab, sys; assert 'torch' not in sys.modules, sorted(sys.modules)")


def test_importing_kernellab_has_no_side_effects():
    _fresh("""
        import ast, os, sys
        import kernellab
        assert 'torch' not in sys.modules
        assert 'TRITON_INTERPRET' not in os.environ
        assert ast.parse.__module__ == 'ast', ast.parse
        assert not [m for m in sys.modules if m.startswith('kernellab.')], sorted(sys.modules)
    """)


def test_the_public_names_are_the_modules_own():
    from kernellab import campaign, export, problem, wholemodel

    assert kernellab.Problem is problem.Problem and kernellab.ProblemError is problem.ProblemError
    assert kernellab.load_problem is problem.load_problem
    assert kernellab.load_best is export.load_best and kernellab.run is campaign.run
    assert kernellab.optimize is wholemodel.optimize and kernellab.patch is wholemodel.patch
    assert kernellab.__version__ == "0.1.0"
    for name in kernellab.__all__:
        assert getattr(kernellab, name) is not None and name in dir(kernellab)
    with pytest.raises(AttributeError):
        kernellab.no_such_name  # noqa: B018


def test_optimize_is_a_function_in_a_fresh_process():
    """``kernellab.optimize(model, inputs)`` is the plain function ``kernellab.wholemodel.optimize``, whichever
    is imported first; ``from kernellab import optimize`` gives the same function."""
    _fresh("""
        import types
        import kernellab
        import kernellab.wholemodel as mod
        from kernellab.wholemodel import optimize, patch
        assert kernellab.optimize is optimize and isinstance(optimize, types.FunctionType)
        assert kernellab.patch is patch and type(mod) is types.ModuleType
        from kernellab import optimize as again
        assert again is optimize
        try:
            kernellab.optimize(object(), [])
        except mod.OptimizeError as exc:
            assert 'not a torch.nn.Module' in str(exc), exc
        else:
            raise AssertionError('optimize took an object')
    """)


def test_submodules_are_reached_as_attributes():
    """The eager package had every module loaded: ``kernellab.export.export`` after ``import kernellab`` still works."""
    _fresh("""
        import kernellab
        assert callable(kernellab.export.export) and kernellab.campaign.run is kernellab.run
    """)


def test_setup_switches_to_the_interpreter_and_locks_ast_parse():
    r = _fresh("""
        import ast, os, torch
        from kernellab import _astlock, _runtime
        _runtime.setup()
        cuda = torch.cuda.is_available()
        assert os.environ.get('TRITON_INTERPRET') == (None if cuda else '1')
        assert _runtime.interpreter_chosen is (not cuda)
        assert ast.parse is _astlock.parse
        _runtime.setup()  # idempotent
        assert ast.parse is _astlock.parse and ast.parse.__wrapped__ is not _astlock.parse
        print('ok')
    """)
    assert "ok" in r.stdout


def test_setup_leaves_a_users_triton_interpret_alone():
    _fresh("""
        import os
        from kernellab import _runtime
        _runtime.setup()
        assert os.environ['TRITON_INTERPRET'] == '0' and not _runtime.interpreter_chosen
    """, TRITON_INTERPRET="0")


@pytest.fixture
def setups(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    monkeypatch.setattr(_runtime, "setup", lambda: calls.append(1))
    return calls


def test_the_entry_points_set_up_first(setups: list[int], tmp_path: Path) -> None:
    """Each entry point makes the settings before its work, even when that work then fails on bad input."""
    from click.testing import CliRunner

    from kernellab import bench, campaign, cli, demo, export, study, wholemodel
    from kernellab.store import Store

    store = Store(tmp_path / "k.db")
    cases = {
        "run": lambda: campaign.run(str(tmp_path / "missing.py"), db=str(tmp_path / "k.db")),
        "run_campaign": lambda: campaign.run_campaign(store, "missing"),
        "load_best": lambda: export.load_best(store, "missing"),
        "export": lambda: export.export(store, "missing"),
        "optimize": lambda: wholemodel.optimize(object(), []),
        "patch": lambda: wholemodel.patch(object(), store),
        "bench": lambda: bench.run_bench("no-such-suite", store, {}),
        "study": lambda: study.run_study("no-such-suite", store, policies=["greedy"], agents=["builtin"], seeds=1,
                                         config_kw={}),
        "demo": lambda: demo.main(["--problem", str(tmp_path / "missing.py"), "--db", str(tmp_path / "d.db")]),
    }
    for name, call in cases.items():
        before = len(setups)
        with pytest.raises(Exception):  # noqa: B017 - any failure: only the setup before it is under test
            call()
        assert len(setups) > before, f"{name} did not set up the runtime"
    before = len(setups)
    CliRunner().invoke(cli.main, ["status", "--db", str(tmp_path / "k.db")])
    assert len(setups) > before, "the CLI did not set up the runtime"
