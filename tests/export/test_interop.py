"""Interop: the store file is plain Optuna storage too (``optuna-dashboard sqlite:///kernellab.db``) and
plain SQLite for ``datasette``; Optuna's tables and ours coexist in one file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import optuna
import pytest

from kernellab import Problem
from kernellab.search._tune import optuna_storage, study_name
from kernellab.store import Store

SRC = ("import torch\nclass Model(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
       "def get_inputs():\n    return [torch.randn(8)]\ndef get_init_inputs():\n    return []\n")


def _objective(trial: optuna.Trial) -> float:
    block = trial.suggest_categorical("BLOCK", [32, 64, 128, 256])
    warps = trial.suggest_int("num_warps", 1, 8, log=True)
    return -abs(block - 128) - abs(warps - 4)


def test_optuna_loads_every_study_from_the_store_file(tmp_path: Path) -> None:
    db = tmp_path / "kernellab.db"
    store = Store(db)
    cid = store.create_campaign("interop", {}, "cpu", {})
    pid = store.add_problem(Problem(name="double", source=SRC, path="double.py"))
    cands = [store.add_candidate(cid, pid, SRC + f"# variant {i}\n", origin="seed") for i in range(3)]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    # the studies are created the way kernellab's tuner creates them, next to our tables
    for i, cand in enumerate(cands):
        study = optuna.create_study(study_name=study_name(cand), storage=optuna_storage(store), direction="maximize",
                                    sampler=optuna.samplers.RandomSampler(seed=i))
        study.optimize(_objective, n_trials=2 + i)
    store.add_evaluation(cands[0], {"status": "correct", "median_ms": 1.0, "device": "cpu"})
    store.close()

    url = f"sqlite:///{db}"  # what a user passes to optuna-dashboard
    summaries = optuna.study.get_all_study_summaries(url)
    assert sorted(s.study_name for s in summaries) == sorted(study_name(c) for c in cands)
    for s in summaries:
        study = optuna.load_study(study_name=s.study_name, storage=url)
        i = cands.index(s.study_name.removeprefix("kernellab-"))
        assert len(study.trials) == 2 + i and s.n_trials == 2 + i
        assert set(study.best_trial.params) == {"BLOCK", "num_warps"}

    # our store accepts the shared file afterwards (its _check_file sees our migrations) and keeps working
    with Store(db) as again:
        assert again.get_campaign("interop")["id"] == cid
        assert len(again.candidates(cid)) == 3 and len(again.evaluations(campaign_id=cid)) == 1
        again.add_candidate(cid, pid, SRC + "# after optuna\n", origin="human")
    tables = {r[0] for r in sqlite3.connect(db).execute("select name from sqlite_master where type='table'")}
    assert {"campaigns", "candidates", "evaluations", "studies", "trials"} <= tables
    assert len(optuna.study.get_all_study_summaries(url)) == 3  # and Optuna still reads it after our writes


def test_plain_sqlite_readers_see_our_tables(tmp_path: Path) -> None:
    """What datasette does: open the file read-only and read any table."""
    db = tmp_path / "kernellab.db"
    with Store(db) as s:
        cid = s.create_campaign("ro", {"budget": 1}, "cpu", {})
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        assert conn.execute("select id, name from campaigns").fetchall() == [(cid, "ro")]
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("delete from campaigns")  # read-only: browsing never changes the store
    finally:
        conn.close()
