"""The test report (KERNELLAB_TEST_REPORT) and a suite that goes on from it (KERNELLAB_TESTS_DONE): how a GPU suite
longer than one device call spans several (tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ["tests/test_astlock.py"]


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", *TESTS],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def test_a_suite_goes_on_where_the_report_of_the_last_call_stopped(tmp_path: Path) -> None:
    report = tmp_path / "report.txt"
    first = _pytest(tmp_path, KERNELLAB_TEST_REPORT=str(report))
    assert first.returncode == 0, first.stdout[-2000:]
    lines = report.read_text().splitlines()
    assert len(lines) == 2 and all(x.startswith("PASSED ") and "tests/test_astlock.py::" in x for x in lines), lines
    # one test "passed" in the last call: only the other runs now
    report.write_text(lines[0] + "\n")
    again = _pytest(tmp_path, KERNELLAB_TESTS_DONE=str(report))
    assert again.returncode == 0 and "1 passed, 1 deselected" in again.stdout, again.stdout[-2000:]
