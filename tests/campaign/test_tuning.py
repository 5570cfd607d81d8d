"""Tuning inside a campaign: on by default on a GPU (trials scaled to the budget), off on the CPU
unless asked for, and when it runs, its best configuration is an evaluation the selection sees."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kernellab.campaign import TUNE_TRIALS_MAX, TUNE_TRIALS_MIN, CampaignConfig
from kernellab.store import Store
from kernellab.vocab import Kind, best_evaluation, is_winner_retime

ROOT = Path(__file__).resolve().parents[2]
GELU = ROOT / "experiments" / "problems" / "ops" / "gelu.py"  # its builtin seed has a per-kernel SPACE


def _kernellab(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernellab.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=900)


def test_tune_trials_default_cpu_off_gpu_scaled_to_the_budget() -> None:
    assert CampaignConfig(problems=[]).tune_trials is None  # "not given": the device decides
    assert CampaignConfig(problems=[], budget=64).tune_trials_on("cpu") == 0
    assert CampaignConfig(problems=[], budget=2).tune_trials_on("cuda") == TUNE_TRIALS_MIN
    assert CampaignConfig(problems=[], budget=16).tune_trials_on("cuda") == 16
    assert CampaignConfig(problems=[], budget=500).tune_trials_on("cuda") == TUNE_TRIALS_MAX
    # given: used as it is, on either device; 0 turns tuning off on a GPU too
    assert CampaignConfig(problems=[], tune_trials=3).tune_trials_on("cpu") == 3
    assert CampaignConfig(problems=[], tune_trials=0).tune_trials_on("cuda") == 0


def _check_tuning(store: Store, cid: str, db: Path) -> list[dict]:
    """No tune event carries an error, and each tuning's best configuration was recorded as a correct
    evaluation with that config, which the vocabulary ranks first among the tuning's re-timings."""
    import optuna

    from kernellab.search._tune import study_name

    events = [e["payload"] for e in store.events(cid, "tune")]
    assert events, "no candidate was tuned"
    assert not [p for p in events if "error" in p], [p.get("error") for p in events]
    for t in events:
        assert t["best_config"], t
        study = optuna.load_study(study_name=study_name(t["candidate_id"]), storage=f"sqlite:///{db}")
        assert study.study_name == t["study"]
        assert [tr for tr in study.trials if tr.state.name == "COMPLETE"]
        assert len(store.evaluations(candidate_id=t["candidate_id"], kind=Kind.TRIAL)) >= 1
        retimes = [e for e in store.evaluations(candidate_id=t["candidate_id"], kind=Kind.RETIME)
                   if not is_winner_retime(e)]
        assert any(e["status"] == "correct" and e["config"] == t["best_config"] for e in retimes)
        assert best_evaluation(retimes)["config"] == t["best_config"]
    return events


@pytest.mark.slow
def test_cpu_campaign_tunes_with_tune_trials(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    r = _kernellab("run", str(GELU), "--db", str(db), "--campaign", "tuned", "--budget", "2", "--width", "1",
                   "--trials", "2", "--debug-rounds", "0", "--tune-trials", "3", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    store = Store(db)
    camp = store.get_campaign("tuned")
    _check_tuning(store, camp["id"], db)
    # tuning's re-timings take part in the selection: it is the vocabulary's best of every row
    selected = store.best(camp["id"])[0]
    assert best_evaluation(store.evaluations(campaign_id=camp["id"]), camp["config"]["objective"])["id"] == selected["id"]
    assert json.loads(r.stdout)["best"], "no correct candidate"


@pytest.mark.slow
def test_cpu_campaign_does_not_tune_by_default(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    r = _kernellab("run", str(GELU), "--db", str(db), "--campaign", "plain", "--budget", "1", "--trials", "2",
                   "--debug-rounds", "0", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    store = Store(db)
    cid = store.get_campaign("plain")["id"]
    assert store.get_campaign(cid)["config"]["tune_trials"] is None
    assert not store.events(cid, "tune") and not store.evaluations(campaign_id=cid, kind=Kind.TRIAL)


@pytest.mark.gpu
def test_gpu_campaign_tunes_by_default(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    # budget 2: the two seeds and one tuning (budget 4 tuned three candidates in 75 of the campaign's 195 s, H200).
    # --small: tuning by default is what is tested; at its full size (1.6 GB of input) the test took 266 s of the
    # suite's parallel group on the H200 (session 9), the longest of all
    r = _kernellab("run", str(GELU), "--db", str(db), "--campaign", "gpu-tuned", "--budget", "2", "--width", "2",
                   "--small", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    store = Store(db)
    cid = store.get_campaign("gpu-tuned")["id"]
    events = _check_tuning(store, cid, db)
    assert all(t["evaluated"] <= TUNE_TRIALS_MIN for t in events)  # a small budget: TUNE_TRIALS_MIN trials each
