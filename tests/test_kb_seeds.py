"""experiments/kb_seeds.py: the builtin seeds of a suite against their floor, worst first, with a bench
database's finished problems left out (a database written through the store API)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import shutil
from pathlib import Path

from kernellab import load_problem
from kernellab.store import Store

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("kb_seeds", ROOT / "experiments" / "kb_seeds.py")
seeds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(seeds)

P = ROOT / "experiments" / "problems" / "ops"
NAMES = ("softmax", "gemm_square", "transpose")


def _suite(tmp_path: Path) -> str:
    d = tmp_path / "suite"
    d.mkdir()
    for n in NAMES:
        shutil.copy(P / f"{n}.py", d / f"{n}.py")
    return str(d / "*.py")


def _done_db(tmp_path: Path, name: str) -> Path:
    """A bench database in which ``name``'s campaign is done and softmax's still running, gzipped."""
    path = tmp_path / "bench.db"
    store = Store(str(path))
    for n, status in ((name, "done"), ("softmax", "running")):
        cid = store.create_campaign(f"bench-{n}", {}, "cpu", {}, status=status)
        pid = store.add_problem(load_problem(P / f"{n}.py", validate_run=False))
        store.add_candidate(cid, pid, "x = 1\n", origin="builtin", action="seed")
    store.close()
    with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    return Path(str(path) + ".gz")


def test_the_page_ranks_the_seeds_by_their_floor(tmp_path):
    out = tmp_path / "out"
    assert seeds.main(["--suite", _suite(tmp_path), "--name", "t", "--out-dir", str(out)]) == 0
    (md,) = out.glob("*-cpu-t.md")
    data = json.loads(md.with_suffix(".json").read_text())
    rows = data["rows"]
    assert sorted(r["problem"] for r in rows) == sorted(NAMES)
    for r in rows:
        assert "error" not in r, r
        assert r["seed_ms"] > 0 and r["eager_ms"] > 0 and r["slowest_group"]
        if r["floor_ms"] is not None:  # the model never beats the floor it is built on
            assert r["seed_over_floor"] >= 0.99
    ratios = [r["seed_over_floor"] or 0.0 for r in rows]
    assert ratios == sorted(ratios, reverse=True)
    text = md.read_text()
    assert all(f"| {n} |" in text for n in NAMES)


def test_a_databases_finished_problems_are_left_out(tmp_path):
    out = tmp_path / "out"
    db = _done_db(tmp_path, "gemm_square")
    assert seeds.main(["--suite", _suite(tmp_path), "--db", str(db), "--name", "t", "--out-dir", str(out)]) == 0
    (md,) = out.glob("*-cpu-t.md")
    rows = json.loads(md.with_suffix(".json").read_text())["rows"]
    assert sorted(r["problem"] for r in rows) == ["softmax", "transpose"]
    assert "(1 finished in `bench.db.gz` left out)" in md.read_text()


def test_bad_input_is_one_line(tmp_path, capsys):
    assert seeds.main(["--suite", str(tmp_path / "none" / "*.py"), "--out-dir", str(tmp_path)]) == 2
    assert seeds.main(["--suite", _suite(tmp_path), "--db", str(tmp_path / "no.db"), "--out-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("kb_seeds: no problem file") and err[1].startswith("kb_seeds: no database")
