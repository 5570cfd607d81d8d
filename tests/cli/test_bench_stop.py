"""A real `kernellab bench --jobs 4` told to stop by SIGINT or SIGTERM while its four campaigns run: it exits
within 10 s (the design's throughput contract), every evaluation finished before the signal is in the database, no campaign
is left `running`, no job its stop killed is recorded as a candidate's verdict, and the same command then
finishes the suite, resuming the stopped campaigns."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# PYTHONPATH: the checkout under test wins over any installed kernellab
ENV = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
# budget 12 keeps each of the four campaigns busy for about half a minute on 2 CPU cores: a bench that waited
# for its campaigns to end (the old `with ThreadPoolExecutor`) takes far longer than 10 s to stop
ARGS = ["bench", "ci", "--small", "--budget", "12", "--trials", "2", "--width", "2", "--jobs", "4"]


def _bench(tmp_path: Path, *extra: str) -> subprocess.Popen:
    # SIGINT with its default action, as a terminal delivers it (pytest may have left it ignored)
    return subprocess.Popen([sys.executable, "-m", "kernellab.cli", *ARGS, "--db", "b.db", "--out-dir", "out", *extra],
                            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _query(db: Path, sql: str) -> list:
    with sqlite3.connect(db) as c:
        return c.execute(sql).fetchall()


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_bench_stops_within_10_s_saved_and_a_rerun_finishes(tmp_path: Path, sig: signal.Signals) -> None:
    db = tmp_path / "b.db"
    p = _bench(tmp_path)
    # the signal lands with all four campaigns running and one evaluation recorded
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if (_query(db, "select count(*) from evaluations")[0][0] >= 1
                    and _query(db, "select count(*) from campaigns where status = 'running'")[0][0] == 4):
                break
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    assert p.poll() is None, "the bench ended before it could be stopped"
    before = {r[0] for r in _query(db, "select id from evaluations")}
    t0 = time.monotonic()
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        _, err = p.communicate()
    took = time.monotonic() - t0
    assert took < 10, f"{sig.name} took {took:.1f} s to stop the bench; it said: {err[-3000:]}"
    assert p.returncode == 1, err[-3000:]
    assert "kernellab: interrupted" in err.strip().splitlines()[-1], err[-3000:]
    statuses = _query(db, "select name, status from campaigns")
    assert len(statuses) == 4 and all(s == "stopped" for _, s in statuses), statuses
    after = _query(db, "select id, status, error_class from evaluations")
    assert before <= {r[0] for r in after}  # every evaluation finished before the signal is kept
    # a job the stop killed is no verdict on its candidate
    assert not [r for r in after if (r[2] or "").startswith(("signal:", "shutdown"))], after
    # the page was written at the stop and says what this call did
    (page,) = (tmp_path / "out").glob("*.json")
    res = json.loads(page.read_text())
    assert res["problems_finished"] < 4 and res["pace"]["evaluations"] >= len(before) >= 1

    # the same command resumes the four stopped campaigns and finishes the suite
    p = _bench(tmp_path, "--json")
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert "0 to start" in err and "4 to resume" in err, err[:2000]
    res = json.loads(out)
    assert res["complete"] and res["summary"]["correct"] == 4
    assert {r[0] for r in _query(db, "select name from campaigns where status = 'done'")} == {n for n, _ in statuses}
