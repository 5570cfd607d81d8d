"""Fixtures of the LLM agent tests; the recorded-exchange helpers are in ``llm_recorded.py``."""

from __future__ import annotations

import pytest
from llm_recorded import ROOT

from kernellab.problem import load_problem
from kernellab.store import Store


@pytest.fixture
def store():
    s = Store(":memory:")
    yield s
    s.close()


@pytest.fixture
def problem():
    return load_problem(ROOT / "experiments" / "problems" / "fusions" / "gemm_bias_gelu.py")


@pytest.fixture
def campaign(store, problem):
    store.add_problem(problem)
    return store.create_campaign("llm-test", {"llm": "test"}, "cpu", {})


@pytest.fixture(autouse=True)
def _no_real_keys(monkeypatch):
    # Tests never see a developer's real keys, whatever the environment holds.
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
