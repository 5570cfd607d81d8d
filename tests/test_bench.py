"""`kernellab bench` on the CPU: a campaign per problem of the ci suite, honest summary, result files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernellab.bench import suite_paths, summarize, to_markdown


def test_suite_paths_and_errors(tmp_path: Path) -> None:
    assert len(suite_paths("ci")) >= 3
    assert len(suite_paths("full")) >= 30
    with pytest.raises(FileNotFoundError, match="no suite"):
        suite_paths("no-such-suite")
    f = tmp_path / "s.txt"
    f.write_text("experiments/problems/ops/softmax.py\nexperiments/problems/ops/nope.py\n")
    with pytest.raises(FileNotFoundError, match="nope.py"):
        suite_paths(str(f))


def _row(name: str, correct: bool, se: float | None, sc: float | None, interpreted: bool = False) -> dict:
    return {"problem": name, "correct": correct, "speedup_eager": se, "speedup_compile": sc,
            "interpreted": interpreted, "failures": {} if correct else {"mismatch": 2}}


def test_fast_p_counts_all_problems() -> None:
    rows = [_row("a", True, 2.5, 1.2), _row("b", True, 1.2, 0.8), _row("c", False, None, None),
            _row("d", True, 0.5, 0.4)]
    s = summarize(rows)
    assert s["fast_0_eager"] == 0.75  # correct
    assert s["fast_1_eager"] == 0.5 and s["fast_1_compile"] == 0.25
    assert s["fast_2_eager"] == 0.25 and s["fast_1.5_compile"] == 0.0
    assert s["geomean_eager_correct"] == pytest.approx((2.5 * 1.2 * 0.5) ** (1 / 3))
    assert s["geomean_eager_all"] == pytest.approx((2.5 * 1.2 * 1.0 * 0.5) ** (1 / 4))
    assert s["failures"] == {"mismatch": 2}


def test_interpreted_runs_claim_no_speedup() -> None:
    s = summarize([_row("a", True, None, None, interpreted=True)])
    assert s["interpreted"] and s["fast_0_eager"] == 1.0 and s["fast_1_eager"] is None
    assert s["geomean_eager_all"] is None
    md = to_markdown({"suite": "x", "date": "d", "device": "cpu", "versions": {}, "config": {},
                      "summary": s, "problems": []})
    assert "no speedup is claimed" in md


def test_bench_cli_on_cpu(tmp_path: Path) -> None:
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "bench", "ci", "--small", "--budget", "2",
                        "--trials", "2", "--width", "2", "--jobs", "2", "--db", str(tmp_path / "b.db"),
                        "--out-dir", str(out), "--json"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    n = len(suite_paths("ci"))
    assert result["summary"]["problems"] == n and result["complete"]
    assert result["summary"]["correct"] == n, [p for p in result["problems"] if not p["correct"]]
    assert result["summary"]["interpreted"] and result["summary"]["fast_1_eager"] is None
    for p in result["problems"]:
        assert p["speedup_eager"] is None and p["actions"] and p["evaluations"] >= 1
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".json", ".md"]
    assert json.loads(files[0].read_text())["summary"] == result["summary"]
