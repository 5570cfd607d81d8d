"""experiments/kb_budget_estimate.py on a real CPU bench: its counts are the database's, its pace the pages', and
its two ends follow the rule its docstring states; pages from two devices are refused in one line."""

from __future__ import annotations

import importlib.util
import json
import sqlite3
from pathlib import Path

import pytest

from kernellab.bench import run_bench
from kernellab.store import Store

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("kb_budget_estimate", ROOT / "experiments" / "kb_budget_estimate.py")
est = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(est)

KW = {"budget": 2, "trials": 1, "width": 1, "debug_rounds": 0, "device": "cpu", "small": True}


@pytest.fixture(scope="module")
def benched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("estimate")
    suite = tmp / "one.txt"
    suite.write_text("experiments/problems/ops/softmax.py\n")
    run_bench(str(suite), Store(tmp / "b.db"), KW, out_dir=tmp / "pages")
    return tmp / "b.db", tmp / "pages"


def test_the_estimate_is_the_databases_counts_at_the_pages_pace(benched: tuple[Path, Path], tmp_path: Path) -> None:
    db, pages = benched
    (page,) = pages.glob("*.json")
    p = json.loads(page.read_text())["pace"]
    assert est.main(["--db", str(db), "--pages", str(pages / "*.json"), "--budget", "8", "--problems", "10",
                     "--out-dir", str(tmp_path)]) == 0
    (out,) = tmp_path.glob("*-kb-budget8-estimate.json")
    r = json.loads(out.read_text())
    with sqlite3.connect(db) as con:
        kinds = dict(con.execute("SELECT kind, COUNT(*) FROM evaluations GROUP BY kind").fetchall())
    assert r["base_budget"] == 2 and r["finished_campaigns"] == 1
    assert r["evaluations_per_campaign"] == {k: float(v) for k, v in sorted(kinds.items())}
    assert r["pace"]["evaluations"] == p["evaluations"] and r["pace"]["wall_s"] == round(p["wall_s"], 1)
    now = sum(kinds.values())
    grows = sum(v for k, v in kinds.items() if k in ("full", "trial", "profile"))
    assert r["at_base"]["evaluations_per_problem"] == round(now, 1)
    assert r["low"]["evaluations_per_problem"] == round(now + 3 * grows, 1)  # budget 2 -> 8: four times
    assert r["high"]["evaluations_per_problem"] == round(4 * now, 1)
    assert r["high"]["bench_s"] == round(10 * 4 * now / (p["evaluations"] / p["wall_s"]))
    assert "| budget 8, every kind scaled (high) |" in out.with_suffix(".md").read_text()


def test_pages_of_two_devices_or_no_database_are_refused(benched: tuple[Path, Path], tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    db, pages = benched
    (page,) = pages.glob("*.json")
    other = json.loads(page.read_text())
    other["device"] = "NVIDIA H100 80GB HBM3"
    (tmp_path / "other.json").write_text(json.dumps(other))
    (tmp_path / "mine.json").write_text(page.read_text())
    assert est.main(["--db", str(db), "--pages", str(tmp_path / "*.json"), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kb_budget_estimate: the pages come from more than one device") and err.count("\n") == 1
    assert est.main(["--db", str(tmp_path / "none.db"), "--pages", str(pages / "*.json")]) == 2
    assert "no such database" in capsys.readouterr().err
    assert not list(tmp_path.glob("*estimate*"))
