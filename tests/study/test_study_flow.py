"""`kernellab study` then `kernellab compare` on the CPU: two small bundled problems, 2 policies x 2 seeds at a
small budget, the interpreter's objective (no speedup claimed); a rerun runs nothing new."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from kernellab.cli import main
from kernellab.compare import SECTIONS
from kernellab.store import Store
from kernellab.study import StudyError, run_study

TINY = ["experiments/problems/ops/softmax.py", "experiments/problems/fusions/pointwise_chain.py"]
KW = {"budget": 2, "trials": 1, "width": 1, "debug_rounds": 0, "device": "cpu", "small": True}
CLI_KW = ["--budget", "2", "--trials", "1", "--width", "1", "--debug-rounds", "0", "--device", "cpu", "--small"]


def _counts(db: Path) -> dict:
    with sqlite3.connect(db) as c:
        return {t: c.execute(f"select count(*) from {t}").fetchone()[0]
                for t in ("campaigns", "candidates", "evaluations", "llm_calls")}


@pytest.mark.slow
def test_study_runs_the_matrix_incrementally_and_compare_reads_it(tmp_path: Path, monkeypatch) -> None:
    suite = tmp_path / "tiny.txt"
    suite.write_text("\n".join(TINY) + "\n")
    db, out = tmp_path / "s.db", tmp_path / "out"
    store = Store(db)
    lines: list[str] = []
    r = run_study(str(suite), store, name="ci", policies=["greedy", "beam"], seeds=2, config_kw=KW, out_dir=out,
                  log=lines.append)
    assert r["complete"] and r["campaigns_total"] == 8 and [c["started"] for c in r["ran"]] == [2, 2, 2, 2]
    camps = store.list_campaigns()
    assert len(camps) == 8
    cells = {}
    for c in camps:
        tag = c["config"]["study"]
        assert tag["names"] == ["ci"] and tag["cell"] == f"{c['config']['policy']}|builtin|s{c['config']['seed']}"
        cells.setdefault(tag["cell"], set()).add(c["config"]["bench"]["config_hash"])
    # seed-major: both policies' seed 0 before any seed 1
    assert [c["cell"] for c in r["ran"]] == ["greedy|builtin|s0", "beam|builtin|s0", "greedy|builtin|s1",
                                            "beam|builtin|s1"]
    recorded = {c["key"]: c["config_hash"] for c in store.get_study("ci")["config"]["cells"]}
    assert {k: {v} for k, v in recorded.items()} == cells  # the studies table names each cell's bench hash

    # the same study again, through the command line: nothing new runs
    store.close()
    before = _counts(db)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(main, ["study", str(suite), "--policy", "greedy,beam", "--seeds", "2", *CLI_KW,
                                    "--name", "ci", "--db", str(db), "--out-dir", str(out), "--json"])
    assert res.exit_code == 0, res.output
    again = json.loads(res.stdout)
    assert all((c["skipped"], c["resumed"], c["started"]) == (2, 0, 0) for c in again["ran"]) and again["complete"]
    assert _counts(db) == before

    # one more policy on seed 0 only: just that cell runs; shared settings that differ are refused
    store = Store(db)
    r3 = run_study(str(suite), store, name="ci", policies=["greedy", "uct"], seeds=[0], config_kw=KW, out_dir=out)
    assert [(c["cell"], c["skipped"], c["started"]) for c in r3["ran"]] == [("greedy|builtin|s0", 2, 0),
                                                                           ("uct|builtin|s0", 0, 2)]
    assert len(store.get_study("ci")["config"]["cells"]) == 5 and r3["complete"]
    before = _counts(db)
    with pytest.raises(StudyError, match="budget: 2 -> 3"):
        run_study(str(suite), store, name="ci", policies=["greedy"], seeds=1, config_kw={**KW, "budget": 3})
    with pytest.raises(StudyError, match="not one of"):
        run_study(str(suite), store, name="ci2", policies=["greedy", "nope"], seeds=1, config_kw=KW)
    assert _counts(db) == before and store.get_study("ci2") is None
    store.close()

    page = tmp_path / "ci.html"
    res = CliRunner().invoke(main, ["compare", "--study", "ci", "--db", str(db), "--json", "-o", str(page)])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["groups"] == ["beam", "greedy", "uct"] and len(result["runs"]) == 10
    assert not result["missing"] and not result["unfinished"] and result["suite"] == str(suite)
    # the CPU objective: the interpreter's ratio, labelled so; no speedup and no gain claimed
    assert result["interpreted"] and "not a speedup" in result["value_label"]
    assert "interpreter" in result["time_label"]
    for s in result["strategies"]:
        assert s["correct_found"] == s["runs"] and s["llm"]["gain"] is None and s["llm"]["calls"] == 0
    runs = {(r["group"], r["problem"], r["seed"]) for r in result["runs"]}
    assert len(runs) == 10 and all(0 < r["final_normalized"] <= 1 for r in result["runs"])
    pairs = {(p["a"], p["b"]): p for p in result["pairs"]}
    assert pairs[("beam", "greedy")]["pairs"] == 4 and pairs[("greedy", "uct")]["pairs"] == 2
    for p in pairs.values():  # interpreted timings: counted, never called a win or a loss
        assert p["called"] is False and p["wins"] is None and p["losses"] is None
    html = page.read_text()
    assert html.count("<svg") >= 3 and "no speedup is claimed" in html
    assert all(f'data-section="{s}"' in html for s in SECTIONS)
    # every plotted value came from the interpreter: none of the store's speedup columns is set
    with sqlite3.connect(db) as c:
        assert c.execute("select count(*) from evaluations where speedup_eager is not null").fetchone()[0] == 0


def test_study_cli_bad_input_writes_nothing(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args, msg in ((["ci", "--policy", "greedy,nope"], "--policy 'nope'"),
                      (["ci", "--agents", "gpt"], "--agents 'gpt'"),
                      (["ci", "--seeds", "0"], "--seeds must be at least 1"),
                      (["no-such-suite"], "no suite 'no-such-suite'"),
                      (["ci", "--replay", "x"], "--replay")):
        r = CliRunner().invoke(main, ["study", *args, "--db", "x.db", "--out-dir", "out"])
        assert r.exit_code == 2 and r.stderr.strip().count("\n") == 0 and msg in r.stderr, (args, r.stderr)
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "out").exists()
