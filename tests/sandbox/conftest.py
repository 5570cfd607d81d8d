"""Fixtures of the sandbox tests: one executor for the whole session (starting a worker that imports
torch costs seconds), fake credentials in the environment it starts its workers with, and the
tiny test problems of this folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernellab import load_problem
from kernellab.sandbox import LocalExecutor

HERE = Path(__file__).resolve().parent
PROBLEMS = HERE / "problems"
# Values the writes_env candidate must not find anywhere in its process.
FAKE_SECRETS = {
    "KERNELLAB_TEST_API_KEY": "sk-fake-0123456789",
    "ANTHROPIC_API_KEY": "sk-ant-fake-0123456789",
    "AWS_SECRET_ACCESS_KEY": "aws-fake-0123456789",
    "GITHUB_TOKEN": "ghp_fake0123456789",
    "MY_SERVICE_SECRET": "fake-service-secret-0123456789",
}


@pytest.fixture(scope="session")
def sandbox_executor():
    saved = {k: os.environ.get(k) for k in FAKE_SECRETS}
    os.environ.update(FAKE_SECRETS)  # workers start with a scrubbed copy of this environment
    ex = LocalExecutor(cpu_workers=2, workers_per_gpu=4)
    yield ex
    ex.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def problem():
    def get(name: str):
        return load_problem(PROBLEMS / f"{name}.py")

    return get


@pytest.fixture(scope="session")
def fake_secrets() -> dict:
    return dict(FAKE_SECRETS)
