"""Fixtures: a real in-memory store and a synthetic tree in it."""

from __future__ import annotations

import pytest
from search_synth import Synth

from kernellab.store import Store


@pytest.fixture
def store():
    s = Store(":memory:")
    yield s
    s.close()


@pytest.fixture
def synth(store) -> Synth:
    """r(1.0) -> a(1.5) -> a1(2.0), a2(compile_error); r -> b(1.2) -> b1(1.3); r -> c(incorrect) -> c1(1.1)."""
    t = Synth(store)
    t.add("r", speedup=1.0)
    t.add("a", "r", 1.5)
    t.add("b", "r", 1.2)
    t.add("c", "r", status="incorrect", error_class="mismatch")
    t.add("a1", "a", 2.0)
    t.add("a2", "a", status="compile_error", error_class="CompilationError")
    t.add("b1", "b", 1.3)
    t.add("c1", "c", 1.1)
    return t
