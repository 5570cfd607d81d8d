"""Recorded HTTP exchanges served to the real ``anthropic`` / ``openai`` SDK clients through a
replaced transport: no network. The SDKs use ``httpx2`` (they refuse ``httpx`` objects), so the
transport is ``httpx2.MockTransport`` inside ``httpx2.Client``."""

from __future__ import annotations

import importlib.util
import json
import traceback
import uuid
from pathlib import Path

import httpx2
import torch

from kernellab.problem import instantiate

RECORDINGS = Path(__file__).resolve().parent / "recordings"
ROOT = Path(__file__).resolve().parents[3]
FAKE_ANTHROPIC_KEY = "sk-ant-api03-TESTKEY-0123456789abcdef-never-real"
FAKE_OPENAI_KEY = "sk-proj-TESTKEY0123456789abcdefNEVERREAL"
SONNET = "claude-sonnet-4-6"  # not on the SDK's deprecation list


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


def run_candidate(problem, source: str, tmp_path) -> dict:
    """Run a candidate on the SMALL instance in this process and report like the sandbox does
    (status, error text, max error). Candidate code runs in sandbox workers in a campaign; here the
    model's code is ours (a recording), and what matters is that the failure is real."""
    path = tmp_path / f"cand_{uuid.uuid4().hex[:8]}.py"  # Triton's @jit reads the source file
    path.write_text(source)
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        ref = instantiate(problem, small=True, seed=0)
        new = instantiate(problem, small=True, seed=0, model_cls=mod.ModelNew)
        with torch.no_grad():
            out, expected = new.model(*ref.inputs), ref.model(*ref.inputs)
    except Exception as exc:
        return {"status": "runtime_error", "error_class": type(exc).__name__, "error_text": traceback.format_exc()}
    err = (out - expected).abs().max().item()
    return {"status": "correct" if torch.allclose(out, expected, atol=1e-4, rtol=1e-4) else "incorrect",
            "max_abs_err": err, "error_text": None}
