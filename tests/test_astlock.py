"""ast.parse is serialized across threads once the runtime is set up (python/cpython#106905):
``kernellab._runtime.setup()``, which the entry points call first (the CLI, campaigns, load_best, optimize...;
tests/test_runtime.py checks that they do)."""

from __future__ import annotations

import ast
import threading
import time

import pytest

from kernellab import _astlock, _runtime


@pytest.fixture(autouse=True)
def _set_up() -> None:
    _runtime.setup()  # installs the lock, as every entry point does before its work


def test_ast_parse_is_the_serialized_one_and_still_parses():
    assert ast.parse is _astlock.parse
    assert isinstance(ast.parse("x = 1").body[0], ast.Assign)


def test_a_parse_waits_while_another_thread_holds_the_lock():
    """Two threads never convert at once: a parse started while the lock is held finishes only after it is released."""
    done = []
    with _astlock._LOCK:
        t = threading.Thread(target=lambda: done.append(ast.parse("y = 2")))
        t.start()
        time.sleep(0.3)
        assert not done  # would have parsed at once without the lock
    t.join(5)
    assert done and isinstance(done[0], ast.Module)
