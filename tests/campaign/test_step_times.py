"""A campaign's own steps are timed: a ``step`` event each, a progress line for a slow one, and a sum by
step from the store (``kernellab.campaign.step_times``, ``experiments/campaign_steps.py``)."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from kernellab.agents import graph
from kernellab.campaign import CampaignConfig, format_step_times, run_campaign, start_campaign, step_times
from kernellab.progress import Progress
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
AFFINE = ROOT / "tests" / "agents" / "affine_problem.py"


@pytest.mark.slow
def test_a_cpu_campaign_records_the_seconds_of_each_step(tmp_path: Path, monkeypatch, capsys) -> None:
    # every step counts as slow here, so each one also prints its progress line
    monkeypatch.setattr(graph, "SLOW_STEP_S", 0.0)
    db = tmp_path / "k.db"
    store = Store(db)
    cfg = CampaignConfig(problems=[str(AFFINE)], budget=2, width=2, trials=2, tune_trials=1, debug_rounds=0,
                         inductor_seed=True)
    cid = start_campaign(store, cfg, name="steps")
    buf = io.StringIO()
    with Progress(console=Console(file=buf, width=200), plain=True) as prog:
        run_campaign(store, cid, progress=prog)
    events = [e["payload"] for e in store.events(cid, "step")]
    by = {}
    for p in events:
        by.setdefault(p["step"], []).append(p)
        assert p["seconds"] >= 0 and isinstance(p["seconds"], float)
    assert {"plan", "reference", "code", "evaluate", "profile", "analyze", "retime"} <= set(by), sorted(by)
    assert all(p["problem"] == "affine_problem" for s in ("plan", "code", "evaluate") for p in by[s])
    # the Inductor seed's torch.compile subprocess is a step of its own, named
    inductor = [p for p in by["code"] if p.get("label") == "Inductor seed"]
    assert len(inductor) == 1 and inductor[0]["seconds"] > 0.5, by["code"]
    ref = by["reference"][0]
    assert ref["within"] == "plan" and ref["label"] == "reference profile"
    # the evaluations' wall seconds by sandbox phase, summed over the step's jobs
    phases = by["evaluate"][0]["phases"]
    assert {"reference", "load", "compile"} <= set(phases) and all(v >= 0 for v in phases.values()), phases
    # the builtin seed first; the Inductor seed in the same round when compiled by its plan, else in the next
    assert sum(e["candidates"] for e in by["evaluate"]) == 2
    if "tune" in by:  # a candidate with a SPACE was correct: its trials are counted
        assert by["tune"][0]["trials"] >= 1

    out = buf.getvalue()
    assert out.index("compiling the Inductor seed (torch.compile)") < out.index("Inductor seed compiled in"), out
    assert ("2 evaluation(s) in" in out or "1 evaluation(s) in" in out) and "time by step: " in out, out

    summary = step_times(store, "steps")
    steps = {r["step"]: r for r in summary["steps"]}
    assert "reference" not in steps  # inside plan's own seconds: counted once
    assert steps["evaluate"]["count"] == len(by["evaluate"])
    assert steps["code"]["seconds"] == pytest.approx(sum(p["seconds"] for p in by["code"]), abs=0.01)
    parts = {(r["step"], r["label"]): r for r in summary["parts"]}
    assert parts[("code", "Inductor seed")]["seconds"] == pytest.approx(inductor[0]["seconds"], abs=0.01)
    assert ("plan", "reference profile") in parts
    assert summary["evaluation_phases"]["reference"] > 0
    (seed,) = summary["inductor_seeds"]  # the seed's own account, kept with its candidate
    assert seed["seconds"]["total"] > 0 and "admission" in seed["seconds"], seed
    # the process's age at each point of its start-up, in order (a campaign run in this test process: no CLI stamps)
    ages = summary["startup_age_s"]
    order = ["entered", "agents", "executor", "prefetch", "prepare", "context", "session"]
    assert [ages[k] for k in order] == sorted(ages[k] for k in order), ages
    text = format_step_times(summary)
    assert "start-up, the process's age at each point: " in text
    assert "Inductor seed" in text and "evaluations by sandbox phase" in text and "by part: admission" in text
    store.close()

    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        import campaign_steps
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    capsys.readouterr()
    assert campaign_steps.main(["steps", "--db", str(db), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == summary["steps"]
    assert campaign_steps.main(["nope", "--db", str(db)]) == 2
    assert "no campaign" in capsys.readouterr().err


def test_a_step_cut_short_says_so_in_its_progress_line(tmp_path: Path, monkeypatch) -> None:
    # a bench stopped at its timeout printed "winners re-timed in 301 s" for a re-timing it had cut short
    from types import SimpleNamespace

    from kernellab._interrupt import Stopped

    monkeypatch.setattr(graph, "SLOW_STEP_S", 0.0)
    store = Store(tmp_path / "k.db")
    cid = start_campaign(store, CampaignConfig(problems=[str(AFFINE)], budget=1), name="cut")
    buf = io.StringIO()
    with Progress(console=Console(file=buf, width=200), plain=True) as prog:
        ctx = SimpleNamespace(store=store, campaign_id=cid, problems={}, progress=prog)
        with pytest.raises(Stopped), graph.timed_step(ctx, "tune", slow="tuning of 07bfa01ff2",
                                                      start="tuning 07bfa01ff2"):
            raise Stopped()
        with pytest.raises(RuntimeError), graph.timed_step(ctx, "profile", slow="Nsight Compute profile"):
            raise RuntimeError("ncu")
        with graph.timed_step(ctx, "retime", slow="winners re-timed", start="re-timing the winners"):
            pass
    out = buf.getvalue()
    assert "tuning 07bfa01ff2: stopped after 0 s (Stopped)" in out and "tuning of 07bfa01ff2 in" not in out, out
    assert "profile: failed after 0 s (RuntimeError)" in out and "Nsight Compute profile in" not in out, out
    assert "winners re-timed in 0 s" in out, out
    errors = {e["payload"]["step"]: e["payload"].get("error") for e in store.events(cid, "step")}
    assert errors == {"tune": "Stopped", "profile": "RuntimeError", "retime": None}, errors
