"""Issue 34, item 5: the way back into a campaign. The hint names the database the user gave, a resumed
campaign says where it goes on, `status` tells a campaign whose process is gone from one that runs, and a
second `kernellab.run` under the same name goes on with it or says in one line why it cannot."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import kernellab
from kernellab.campaign import CampaignConfig, CampaignError, campaign_lock, is_stale, problems_to_run, start_campaign
from kernellab.cli import _interruptible, main
from kernellab.problem import load_problem
from kernellab.progress import Progress
from kernellab.store import Store

ROOT = Path(__file__).resolve().parents[2]
KB_GEMM = ROOT / "tests" / "problems" / "kb_gemm_add_relu.py"
TINY = dict(budget=1, width=1, trials=1, debug_rounds=0)


def _campaign(db: Path, name: str = "c") -> tuple[Store, str]:
    store = Store(db)
    cid = start_campaign(store, CampaignConfig(problems=[str(KB_GEMM)], **TINY), name=name,
                         problems=[load_problem(KB_GEMM)])
    return store, cid


def test_stop_hint_names_the_database_given(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    db = tmp_path / "my runs.db"
    store, cid = _campaign(db, "gemm one")

    class BudgetExceeded(Exception):  # an LLM stop, as the agents raise it
        pass

    def stop() -> dict:
        raise BudgetExceeded("$5.00 spent")

    with pytest.raises(SystemExit):
        _interruptible(stop, store, cid)
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"`kernellab resume 'gemm one' --db '{db}'`"), err


def test_status_tells_a_dead_campaign_from_a_running_one(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    store, cid = _campaign(db)  # created `running`, as start_campaign leaves it; no process holds it

    def status(*args: str) -> tuple[dict | list, str]:
        res = CliRunner().invoke(main, ["status", *args, "--db", str(db), "--json"])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout), res.stderr

    assert store.get_campaign(cid)["status"] == "running"
    assert is_stale(store, store.get_campaign(cid))
    assert status("c")[0]["campaign"]["stale"] is True
    assert [r["stale"] for r in status()[0]] == [True]
    res = CliRunner().invoke(main, ["status", "c", "--db", str(db)])
    assert "running (stale: no process)" in res.stdout
    assert f"`kernellab resume c --db {db}` goes on" in res.stderr
    with campaign_lock(store, cid, "c"):  # as run_campaign holds it
        assert status("c")[0]["campaign"]["stale"] is False
        assert not is_stale(store, store.get_campaign(cid))
    assert not list(tmp_path.glob("*.lock"))  # the probe leaves no file behind


def test_resumed_progress_names_its_problem_at_once() -> None:
    store = Store(":memory:")
    cid = store.create_campaign("c", {"budget": 4}, "cpu", {})
    buf = io.StringIO()
    with Progress(console=Console(file=buf, force_terminal=False)) as p:
        p.update(campaign="c", problems_total=2, budget_candidates=4)
        p.seed(store, cid, problem="gemm", resumed=True)
        p.update(last="abc123 correct")
    lines = buf.getvalue().splitlines()
    assert "resumed: 0 evaluated before; going on with problem gemm (1/2)" in lines[0], lines
    assert "] gemm: abc123 correct" in lines[1], lines


def test_a_model_is_named_as_the_user_named_it() -> None:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    (p,) = problems_to_run(model, [torch.randn(2, 4)], "mine")
    assert p.name == "mine"


def test_second_run_with_the_same_name(tmp_path: Path) -> None:
    db = tmp_path / "k.db"
    store, cid = _campaign(db, "mine")
    store.update_campaign(cid, status="done")
    summary = kernellab.run(str(KB_GEMM), db=str(db), name="mine", **TINY)  # finished: its summary, no work
    assert summary["campaign"]["id"] == cid and summary["candidates"] == 0
    with pytest.raises(CampaignError, match=r"^campaign 'mine' in .* has other settings \(budget 1, not 2\)"):
        kernellab.run(str(KB_GEMM), db=str(db), name="mine", **{**TINY, "budget": 2})
    with pytest.raises(CampaignError, match=r"^campaign 'mine' in .* ran other problems"):
        kernellab.run(str(ROOT / "tests" / "agents" / "affine_problem.py"), db=str(db), name="mine", **TINY)
    assert [c["name"] for c in store.list_campaigns()] == ["mine"]


def test_budget_left_counts_what_the_budget_counts() -> None:
    store = Store(":memory:")
    pid = store.add_problem(load_problem(KB_GEMM))
    cid = store.create_campaign("c", {"budget": 6}, "cpu", {})
    for i in range(4):
        store.add_candidate(cid, pid, f"# candidate {i}\n", origin="builtin", action=f"a{i}")
    p = Progress(enabled=False)
    p.update(problems_total=2, budget_candidates=6, in_flight=2)
    p.seed(store, cid, problem="gemm", problem_id=pid, resumed=True)  # a resume: written before count
    assert p.stats.budget_left() == "2 of 6 candidates for this problem (4 written, 2 of them in flight)"
    p.update(problems_done=2)  # a finished campaign has nothing left to spend, not its whole budget
    assert p.stats.budget_left() == "none needed, every problem is done"
