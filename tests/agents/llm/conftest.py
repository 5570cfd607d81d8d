"""Recorded HTTP exchanges served to the real ``anthropic`` / ``openai`` SDK clients through a
replaced transport: no network. The SDKs use ``httpx2`` (they refuse ``httpx`` objects), so the
transport is ``httpx2.MockTransport`` inside ``httpx2.Client``."""

from __future__ import annotations

import json
from pathlib import Path

import httpx2
import pytest
from kernellab.store import Store

from kernellab.problem import load_problem

RECORDINGS = Path(__file__).resolve().parent / "recordings"
ROOT = Path(__file__).resolve().parents[3]
FAKE_ANTHROPIC_KEY = "sk-ant-api03-TESTKEY-0123456789abcdef-never-real"
FAKE_OPENAI_KEY = "sk-proj-TESTKEY0123456789abcdefNEVERREAL"


class Recorded:
    """Serves the exchanges of one or more recording files in order, checking method and path, and
    keeps every request it saw (``bodies`` decodes their JSON)."""

    def __init__(self, *names: str):
        self.exchanges: list[dict] = []
        for name in names:
            self.exchanges += json.loads((RECORDINGS / name).read_text())
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        if not self.exchanges:
            raise AssertionError(f"unexpected request {request.method} {request.url.path}: recording exhausted")
        ex = self.exchanges.pop(0)
        assert (request.method, request.url.path) == (ex["request"]["method"], ex["request"]["path"])
        r = ex["response"]
        return httpx2.Response(r["status"], headers=r.get("headers", {}), json=r["body"])

    def client(self) -> httpx2.Client:
        return httpx2.Client(transport=httpx2.MockTransport(self))

    @property
    def bodies(self) -> list[dict]:
        return [json.loads(r.content) if r.content else {} for r in self.requests]

    def done(self) -> bool:
        return not self.exchanges


def disconnected() -> httpx2.Client:
    """A client whose every request fails as if the network were down."""

    def refuse(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("network disabled in this test", request=request)

    return httpx2.Client(transport=httpx2.MockTransport(refuse))


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
