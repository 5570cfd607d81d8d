"""One run of a campaign at a time: a second `resume` is refused while the first runs, and a run
killed with SIGKILL never blocks the resume after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernellab.campaign import CampaignBusy, campaign_lock
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
AFFINE = ROOT / "tests" / "agents" / "affine_problem.py"


def _kernellab(*args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kernellab.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=cwd)


def test_lock_in_one_process(tmp_path: Path) -> None:
    for store in (Store(tmp_path / "k.db"), Store(":memory:")):
        with campaign_lock(store, "c1", "one"):
            with pytest.raises(CampaignBusy, match=rf"'one' is already running(.*pid {os.getpid()} on)?"):
                with campaign_lock(store, "c1", "one"):
                    pass
            with campaign_lock(store, "c2"):  # another campaign of the same database
                pass
        with campaign_lock(store, "c1"):  # released
            pass
        store.close()
    assert not list(tmp_path.glob("*.lock"))  # removed when the run ends


def test_lock_held_by_a_killed_process_is_free(tmp_path: Path) -> None:
    store = Store(tmp_path / "k.db")
    code = ("import sys, time; from kernellab.store import Store; from kernellab.campaign import campaign_lock\n"
            f"with campaign_lock(Store({str(tmp_path / 'k.db')!r}), 'c1'):\n"
            "    print('held', flush=True); time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CampaignBusy, match=f"pid {holder.pid} on"):
            with campaign_lock(store, "c1"):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert list(tmp_path.glob("*.lock"))  # left behind by the killed holder, unlocked
    with campaign_lock(store, "c1"):
        pass
    store.close()


@pytest.mark.slow
def test_second_resume_refused_and_resume_after_sigkill(tmp_path: Path) -> None:
    db = str(tmp_path / "k.db")
    first = _kernellab("run", str(AFFINE), "--db", db, "--campaign", "busy", "--budget", "6", "--width", "1",
                       "--trials", "2", "--json", cwd=tmp_path)
    # wait until the first run holds the campaign (its session has started)
    deadline = time.monotonic() + 300
    started = False
    while time.monotonic() < deadline and first.poll() is None and not started:
        time.sleep(0.5)
        if Path(db).exists():
            with Store(db) as s:
                camp = s.get_campaign("busy")
                started = camp is not None and any(e["payload"].get("started") for e in s.events(camp["id"], "session"))
    assert started and first.poll() is None, first.communicate()[1][-2000:] if first.poll() is not None else "timeout"

    second = _kernellab("resume", "busy", "--db", db, "--json", cwd=tmp_path)
    out, err = second.communicate(timeout=120)
    assert first.poll() is None, "the first run ended before the second was refused: lengthen it"
    assert second.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "already running" in lines[0] and f"pid {first.pid}" in lines[0], err
    with Store(db) as s:
        camp = s.get_campaign("busy")
        assert camp["status"] == "running"  # the refused resume touched nothing
        sessions = [e for e in s.events(camp["id"], "session") if e["payload"].get("started")]
        assert len(sessions) == 1

    os.kill(first.pid, signal.SIGKILL)  # the orchestrator only, as a user's kill -9 would
    first.wait()
    third = _kernellab("resume", "busy", "--db", db, "--json", cwd=tmp_path)
    out, err = third.communicate(timeout=600)
    assert third.returncode == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["campaign"]["status"] == "done" and summary["best"][0]["retimed"]
