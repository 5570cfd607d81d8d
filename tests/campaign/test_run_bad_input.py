"""`kernellab run` on bad input: one line, exit 2, and no database written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PROBLEM = Path(__file__).resolve().parents[2] / "experiments" / "problems" / "ops" / "softmax.py"


@pytest.mark.parametrize("args, expected", [
    (["--policy", "nope"], "--policy 'nope' is not one of"),
    (["--llm", "anthropic:claude-sonnet-4-5"], "ANTHROPIC_API_KEY is not set"),
    (["--budget", "0"], "--budget must be at least 1"),
    (["--trials", "0"], "--trials must be at least 1"),  # was a 71-line SandboxError traceback, a campaign left
])
def test_bad_run_writes_nothing(tmp_path: Path, args: list[str], expected: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "run", str(PROBLEM), *args],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0]
    assert not list(tmp_path.iterdir()), "bad input wrote files"
