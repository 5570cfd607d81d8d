"""End to end on the CPU: a builtin campaign through every node of the graph, then kill -9 and resume."""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernellab.campaign import CampaignConfig, run_campaign, start_campaign
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "experiments" / "problems" / "fusions" / "gemm_bias_gelu.py"


def _check_complete(store: Store, campaign_id: str, budget: int) -> None:
    cands = store.candidates(campaign_id)
    assert len({c["source_hash"] for c in cands}) == len(cands), "a source recorded twice"
    for c in cands:
        full = store.evaluations(candidate_id=c["id"], kind="full")
        assert len(full) == 1, f"candidate {c['id']} has {len(full)} judged evaluations"
    assert len(cands) <= budget
    stops = store.events(campaign_id, "stop")
    assert stops, "the campaign ended without saying why"
    if len(cands) < budget:  # ended early: a stop rule, never a lost evaluation
        assert any(not s["payload"]["reason"].startswith("budget: candidates") for s in stops)


def _check_tuned(store: Store, campaign_id: str, db: Path) -> None:
    """A `tune` event is not enough (a tuner that raises records one too): an Optuna study with
    completed trials, trial evaluations and a re-timed tuned configuration in the store."""
    import optuna

    from kernellab.search._tune import study_name

    tuned = [e["payload"] for e in store.events(campaign_id, "tune") if "error" not in e["payload"]]
    assert tuned, [e["payload"].get("error") for e in store.events(campaign_id, "tune")]
    for t in tuned:
        study = optuna.load_study(study_name=study_name(t["candidate_id"]), storage=f"sqlite:///{db}")
        assert t["study"] == study.study_name and t["complete"] >= 1
        assert [tr for tr in study.trials if tr.state.name == "COMPLETE"]
        assert store.evaluations(candidate_id=t["candidate_id"], kind="trial")
        retimed = [e for e in store.evaluations(candidate_id=t["candidate_id"], kind="retime")
                   if e["status"] == "correct" and e["config"] == t["best_config"]]
        assert retimed, "the tuned configuration was not re-timed"


@pytest.mark.slow
def test_builtin_campaign_through_every_node(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    store = Store(db)
    cfg = CampaignConfig(problems=[str(PROBLEM)], budget=4, width=2, trials=2, tune_trials=2, plateau=5)
    cid = start_campaign(store, cfg, name="e2e")
    summary = run_campaign(store, cid)
    assert summary["best"], "no correct candidate"
    best = summary["best"][0]
    assert best["interpreted"] and best["speedup_eager"] is None  # CPU: no speedup claimed
    kinds = {e["kind"] for e in store.events(cid)}
    assert {"select", "plan", "code", "tune", "profile", "analyze", "stop", "retime"} <= kinds, kinds
    _check_tuned(store, cid, db)
    assert best["retimed"] and store.get_evaluation(best["evaluation_id"])["kind"] == "retime"
    _check_complete(store, cid, 4)
    cands = store.candidates(cid)
    assert any(c["parent_id"] for c in cands), "no expansion beyond the seeds"
    assert all(c["origin"] in ("builtin", "seed") for c in cands)
    # LangGraph checkpoints are in the same file, under the campaign's thread id
    conn = sqlite3.connect(db)
    n = conn.execute("select count(*) from checkpoints where thread_id = ?", [cid]).fetchone()[0]
    assert n > 0
    assert store.get_campaign(cid)["status"] == "done"


def _kernellab(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kernellab.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    budget = 5
    rng = random.Random(1234)
    p = _kernellab("run", str(PROBLEM), "--db", db, "--campaign", "killme", "--budget", str(budget),
                   "--width", "2", "--trials", "2", "--json", cwd=tmp_path)
    # the first kill comes after the campaign exists (before that there is nothing to resume)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and p.poll() is None:
        if Path(db).exists() and Store(db).get_campaign("killme") is not None:
            break
        time.sleep(0.5)
    kills = 0
    for _ in range(3):
        time.sleep(rng.uniform(0.5, 4))  # the whole campaign takes ~7-15 s on 2 cores once it exists
        if p.poll() is not None:
            break
        os.kill(p.pid, signal.SIGKILL)  # the orchestrator only, as a user's kill -9 would
        p.communicate()  # reaps it and closes its pipes (wait() left them open: ResourceWarning)
        kills += 1
        p = _kernellab("resume", "killme", "--db", db, "--json", cwd=tmp_path)
    out, err = p.communicate(timeout=900)
    assert p.returncode in (0, 1), err
    summary = json.loads(out)
    assert summary["campaign"]["status"] == "done"
    store = Store(db)
    cid = store.get_campaign("killme")["id"]
    _check_complete(store, cid, budget)
    assert kills >= 1, "the campaign finished before it could be killed: lengthen it"
    sessions = store.events(cid, "session")
    # a resume killed while still starting up never records a session; the first run and the last do
    assert 2 <= sum(1 for s in sessions if s["payload"].get("started")) <= kills + 1
