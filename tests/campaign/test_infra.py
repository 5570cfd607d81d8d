"""Infrastructure failures in a campaign: never a candidate's verdict, never the debugger's work, and
a sandbox that cannot start workers stops the campaign with a clear message (saved, resumable)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernellab.campaign import CampaignConfig, run_campaign, start_campaign
from kernellab.sandbox import Limits, LocalExecutor, SandboxUnavailable
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "tests" / "sandbox" / "problems" / "tiny_relu.py"


def test_campaign_stops_when_sandbox_workers_do_not_start(tmp_path: Path) -> None:
    store = Store(tmp_path / "k.db")
    cid = start_campaign(store, CampaignConfig(problems=[str(PROBLEM)], budget=3, width=2, trials=1), name="infra")
    # a startup limit no worker meets: every start fails for real, then the breaker opens
    ex = LocalExecutor(cpu_workers=1, limits=Limits(startup=0.01))
    try:
        with pytest.raises(SandboxUnavailable, match="circuit breaker"):
            run_campaign(store, cid, executor=ex)
    finally:
        ex.shutdown()
    assert store.candidates(cid), "the coder produced nothing to evaluate"
    assert store.evaluations(campaign_id=cid) == []  # no verdict from a failure of ours
    assert store.events(cid, "debug") == []  # and no debugger "fixing" it
    infra = store.events(cid, "infra")
    assert infra and {e["payload"]["error_class"] for e in infra} == {"worker_start"}
    camp = store.get_campaign(cid)
    assert camp["status"] == "stopped"
    assert any("SandboxUnavailable" in (e["payload"].get("stopped") or "") for e in store.events(cid, "session"))
