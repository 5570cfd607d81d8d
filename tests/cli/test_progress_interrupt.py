"""`kernellab run` seen by a newcomer: plain progress lines when stderr is not a terminal, a budget
that counts down, and a Ctrl-C that stops within seconds with the campaign saved and said so last."""

from __future__ import annotations

import io
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from kernellab.progress import Progress

PROBLEM = Path(__file__).resolve().parents[1] / "problems" / "kb_gemm_add_relu.py"


def test_plain_lines_when_not_a_terminal() -> None:
    buf = io.StringIO()
    with Progress(console=Console(file=buf, force_terminal=False)) as p:
        p.update(campaign="c", problems_total=1, budget_candidates=4, budget_wall_s=600)
        p.update(problem="gemm", tree_size=1)
        p.on_evaluation({"status": "timeout", "error_class": "timeout:compile"})
        p.update(last="abc123 timeout")
    out = buf.getvalue()
    assert "problem gemm (1/1)" in out
    assert "abc123 timeout; 1 evaluated (failures: timeout:compile 1); budget left: 3 of 4 candidates" in out
    assert " s of 600 s" in out  # the time budget is shown, never blank


def test_live_panel_shows_the_budget_left() -> None:
    p = Progress(enabled=True, console=Console(file=io.StringIO(), force_terminal=True))
    p.update(budget_candidates=8, tree_size=3)
    buf = io.StringIO()
    Console(file=buf, width=120).print(p._render())
    assert "budget left: 5 of 8 candidates" in buf.getvalue()


@pytest.mark.slow
def test_ctrl_c_stops_within_seconds_and_says_so_last(tmp_path: Path) -> None:
    # 3000 correctness trials keep an evaluation in flight for far longer than the interrupt may take
    # SIGINT as a terminal delivers it: with its default action. A process started with SIGINT ignored keeps
    # it ignored (Python then installs no KeyboardInterrupt handler), and the pytest process may have
    # inherited or been left such a disposition by a library an earlier test ran
    p = subprocess.Popen([sys.executable, "-m", "kernellab.cli", "run", str(PROBLEM), "--budget", "2", "--trials", "3000",
                          "--db", "k.db"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = p.stderr.readline() + p.stderr.readline()  # the instance's sizes, then the problem
    assert "problem kb_gemm_add_relu" in first, first  # a plain line: stderr is a pipe here
    # the interrupt lands while an evaluation is in flight (the seed is stored before it is evaluated):
    # on a loaded CI machine a fixed 5 s could still be start-up
    import sqlite3

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(tmp_path / "k.db") as c:
                if c.execute("select count(*) from candidates").fetchone()[0]:
                    break
        except sqlite3.Error:
            pass
        time.sleep(0.2)
    time.sleep(2)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=300)
    took = time.monotonic() - t0
    assert p.returncode == 1, err
    assert took < 20, f"Ctrl-C took {took:.0f} s"
    assert err.strip().splitlines()[-1].startswith("kernellab: interrupted; the campaign is saved: `kernellab resume ")
    from kernellab.store import Store

    (camp,) = Store(tmp_path / "k.db").list_campaigns()
    assert camp["status"] == "stopped"


def test_summary_names_whole_at_80_columns() -> None:
    from kernellab import views

    name = "57_Conv2d_ReLU_HardSwish_and_more"
    summary = {"campaign": {"id": "c" * 12, "name": "n", "status": "done", "device": "cpu"}, "candidates": 1,
               "evaluations": 1, "statuses": {"correct": 1}, "llm": {"calls": 0, "cost_usd": 0.0},
               "best": [{"problem": name, "problem_id": "p", "candidate_id": "957937efbc7064cf", "status": "correct",
                         "median_ms": 1537.65, "speedup_eager": None, "speedup_compile": None,
                         "interpreted": True, "library_only": False}]}
    buf = io.StringIO()
    old = views.console
    views.console = Console(file=buf, width=80)
    try:
        views.print_summary(summary)
    finally:
        views.console = old
    out = buf.getvalue()
    assert name in out and "957937efbc70" in out and "…" not in out, out
    assert "no speedup claimed" in out


def test_missing_key_message_agrees_with_the_readme(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "ANTHROPIC_API_KEY"}
    r = subprocess.run([sys.executable, "-m", "kernellab.cli", "run", str(PROBLEM), "--llm", "anthropic:claude-sonnet-4-5"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert r.returncode == 2
    assert "give it to this one command" in r.stderr and "export it" not in r.stderr


def test_versions_say_interpreter_for_a_cpu_campaign(monkeypatch: pytest.MonkeyPatch) -> None:
    from kernellab import env

    # the orchestrator never sets TRITON_INTERPRET itself; its CPU workers do
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    env.versions.cache_clear()
    try:
        assert env.versions("cpu")["interpreter"] is True
    finally:
        env.versions.cache_clear()


def test_resumed_panel_starts_from_the_stored_counts(tmp_path: Path) -> None:
    from kernellab.problem import load_problem
    from kernellab.store import Store

    store = Store(tmp_path / "k.db")
    cid = store.create_campaign("c", {"budget": 4}, "cpu", {})
    pid = store.add_problem(load_problem(PROBLEM))
    for i, status in enumerate(("correct", "timeout", "timeout")):
        cand = store.add_candidate(cid, pid, f"# candidate {i}\n", origin="builtin", action=f"a{i}")
        store.add_evaluation(cand, {"status": status, "error_class": None if status == "correct" else "timeout:compile",
                                    "interpreted": True, "device": "cpu"}, kind="full")
    p = Progress(enabled=False)
    p.seed(store, cid, elapsed_before=120.0)
    assert p.stats.evaluated == 3 and p.stats.failures == {"timeout:compile": 2}
    assert p.stats.elapsed >= 120.0
